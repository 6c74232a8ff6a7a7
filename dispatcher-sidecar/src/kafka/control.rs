//! The control topic (`<topic>.control`, one partition, compacted): a
//! queue's operator state that must outlive its instances. Today that is
//! whether the queue is paused: key `pause/<group>`, value
//! `{"paused":true,"at_ms":...}` when paused, a tombstone when resumed.
//!
//! Every instance reads the topic to its end at start, so an instance that
//! restarts or joins the group later starts paused when the queue is, and
//! then follows it, so a change written by any instance reaches this one
//! even when the instance that made it could not tell it directly.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::message::{BorrowedMessage, Message as _};
use serde::{Deserialize, Serialize};

use super::follow::{self, Follower, Start};

/// The record key of a queue's pause state: the group names the queue
/// (every instance serving it is a member), as the pause broadcast does.
pub fn pause_key(group: &str) -> String {
    format!("pause/{group}")
}

#[derive(Debug, Serialize, Deserialize)]
struct PauseValue {
    paused: bool,
    at_ms: i64,
}

/// The value of a pause record; a resume is a tombstone (no value).
pub fn pause_value(at_ms: i64) -> Vec<u8> {
    serde_json::to_vec(&PauseValue {
        paused: true,
        at_ms,
    })
    .expect("a plain struct serializes")
}

/// Whether a record of the pause key says paused: a tombstone says not,
/// a value says what its `paused` says; an unreadable value is `None`.
pub fn decode_pause(value: Option<&[u8]>) -> Option<bool> {
    match value {
        None => Some(false),
        Some(v) => serde_json::from_slice::<PauseValue>(v)
            .ok()
            .map(|p| p.paused),
    }
}

/// Reads `topic` from its beginning, calling `apply` with the pause state
/// of every record of `group`'s key in log order (the last one read at
/// return is the state now), then keeps following it. Blocking: call from
/// `spawn_blocking`.
pub fn follow_pause<F>(
    client_config: &ClientConfig,
    topic: &str,
    group: &str,
    mut apply: F,
) -> anyhow::Result<Follower>
where
    F: FnMut(bool) + Send + 'static,
{
    let key = pause_key(group);
    let name = topic.to_string();
    let give = move |m: &BorrowedMessage<'_>| {
        if m.key() != Some(key.as_bytes()) {
            return;
        }
        match decode_pause(m.payload()) {
            Some(paused) => apply(paused),
            None => {
                tracing::warn!(topic = %name, offset = m.offset(), "unreadable pause record; skipped")
            }
        }
    };
    follow::follow(
        client_config,
        "control-reader",
        topic,
        Start::Beginning,
        give,
    )
}

/// How long a pause or resume waits for its record to be acknowledged.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_back_and_a_tombstone_resumes() {
        assert_eq!(
            decode_pause(Some(&pause_value(1_700_000_000_000))),
            Some(true)
        );
        assert_eq!(decode_pause(None), Some(false));
        assert_eq!(
            decode_pause(Some(br#"{"paused":false,"at_ms":5}"#)),
            Some(false)
        );
        assert_eq!(decode_pause(Some(b"garbage")), None);
        assert_eq!(pause_key("jobs-dispatcher"), "pause/jobs-dispatcher");
    }
}
