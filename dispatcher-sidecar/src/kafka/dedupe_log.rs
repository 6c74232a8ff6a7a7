//! The dedupe topic (`<topic>.dedupe`): one record per message id a produce
//! accepted, keyed by the id, valued with where the first copy went.
//!
//! Every instance reads the topic's last dedupe window at start and then
//! follows it, so an id accepted by any instance, before or after a restart,
//! answers `duplicate` everywhere. The topic is compacted and deleted after
//! the window; readers also drop records older than the window by their
//! timestamp, so correctness does not wait for the broker's cleaner.
//!
//! Window edge: an id whose record is not yet read by another instance (the
//! follow lag, milliseconds) can be accepted there a second time. That is a
//! duplicate message, never a lost one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::message::{BorrowedMessage, Message as _};

pub use super::follow::Follower;
use super::follow::{self, Start};

const VALUE_LEN: usize = 12;

/// The record value: the first copy's partition and offset.
pub fn encode_value(partition: i32, offset: i64) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[..4].copy_from_slice(&partition.to_be_bytes());
    v[4..].copy_from_slice(&offset.to_be_bytes());
    v
}

pub fn decode_value(value: &[u8]) -> Option<(i32, i64)> {
    if value.len() != VALUE_LEN {
        return None;
    }
    let partition = i32::from_be_bytes(value[..4].try_into().ok()?);
    let offset = i64::from_be_bytes(value[4..].try_into().ok()?);
    Some((partition, offset))
}

/// One accepted id, as read back: `(id, partition, offset, accepted at ms)`.
pub type Accepted<'a> = (&'a str, i32, i64, i64);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Reads `topic` from `window` ago to its end, giving `sink` every id, then
/// returns with a [`Follower`] that keeps giving it new ones. Blocking: call
/// from `spawn_blocking`. `client_config` is a plain (group-less) client's.
pub fn follow<F>(
    client_config: &ClientConfig,
    topic: &str,
    window: Duration,
    mut sink: F,
) -> anyhow::Result<Follower>
where
    F: FnMut(Accepted<'_>) + Send + 'static,
{
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let since = now_ms().saturating_sub(window_ms);
    let give = move |m: &BorrowedMessage<'_>| {
        let at = m.timestamp().to_millis().unwrap_or_else(now_ms);
        if at < now_ms().saturating_sub(window_ms) {
            return;
        }
        let (Some(Ok(id)), Some(value)) = (m.key_view::<str>(), m.payload()) else {
            return;
        };
        if let Some((partition, offset)) = decode_value(value) {
            sink((id, partition, offset, at));
        }
    };
    follow::follow(
        client_config,
        "dedupe-reader",
        topic,
        Start::Since(since),
        give,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_damage_is_refused() {
        let v = encode_value(7, 1 << 40);
        assert_eq!(decode_value(&v), Some((7, 1 << 40)));
        assert_eq!(decode_value(&v[..11]), None);
        assert_eq!(decode_value(b""), None);
    }
}
