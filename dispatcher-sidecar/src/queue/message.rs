//! Pure helpers for the records the runtime reads and writes: what a fetched
//! record means (message id, attempt, due time), what a client sees of it,
//! the copy a failure writes, the checks of a produce request, and the names
//! of consumers as small slots.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::message::{Headers, Message};

use crate::lease::{Attempt, ConsumerSlot, Failure, RetryEnvelope, HEADER_PREFIX};
use crate::service::{NewMessage, MAX_PRODUCE_BYTES, MAX_PRODUCE_MESSAGES};

/// The header a produce writes the message id into.
pub const MESSAGE_ID_HEADER: &str = "dispatcher.message-id";
/// The longest message id a produce accepts.
pub const MAX_MESSAGE_ID_BYTES: usize = 256;

/// One fetched record, kept while it may still be leased, is in flight, or
/// waits for its failure copy (the copy needs key, payload and headers).
/// Key and payload are shared (`Bytes`) with the deliveries made of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffered {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    /// Every header, the dispatcher's own included.
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: i64,
    pub envelope: Option<RetryEnvelope>,
    pub message_id: String,
    pub attempt: Attempt,
    /// On a retry tier: not leased before this.
    pub due_ms: Option<i64>,
}

impl Buffered {
    /// Reads a fetched record of `topic` (`is_tier`: a retry-tier topic,
    /// whose envelope's due time holds the message back).
    pub fn from_record<M: Message>(m: &M, is_tier: bool) -> Buffered {
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let timestamp_ms = m.timestamp().to_millis().unwrap_or(0);
        Buffered::new(
            m.topic(),
            m.partition(),
            m.offset(),
            m.key().map(Bytes::copy_from_slice),
            m.payload().map(Bytes::copy_from_slice).unwrap_or_default(),
            headers,
            timestamp_ms,
            is_tier,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<Bytes>,
        payload: Bytes,
        headers: Vec<(String, Vec<u8>)>,
        timestamp_ms: i64,
        is_tier: bool,
    ) -> Buffered {
        // A record with only some of our headers (our produce writes the
        // message id alone) or damaged ones is served as a first attempt.
        let envelope = RetryEnvelope::from_headers(&headers).unwrap_or_default();
        let message_id = envelope
            .as_ref()
            .map(|e| e.message_id.clone())
            .or_else(|| {
                headers
                    .iter()
                    .rev()
                    .find(|(k, _)| k == MESSAGE_ID_HEADER)
                    .and_then(|(_, v)| String::from_utf8(v.clone()).ok())
            })
            .unwrap_or_else(|| derived_message_id(topic, partition, offset));
        let attempt = envelope.as_ref().map_or(Attempt::FIRST, |e| e.attempt);
        let due_ms = if is_tier {
            envelope.as_ref().and_then(|e| e.due_ms)
        } else {
            None
        };
        Buffered {
            key,
            payload,
            headers,
            timestamp_ms,
            envelope,
            message_id,
            attempt,
            due_ms,
        }
    }

    /// When the message was first enqueued.
    pub fn enqueued_at_ms(&self) -> i64 {
        self.envelope
            .as_ref()
            .map_or(self.timestamp_ms, |e| e.first_enqueued_ms)
    }

    /// The producer's headers, without the dispatcher's own.
    pub fn user_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers
            .iter()
            .filter(|(k, _)| !k.starts_with(HEADER_PREFIX))
            .cloned()
            .collect()
    }

    /// Where the message first was: (partition, offset) in the queue's
    /// topic. A message produced with a delay never was in it: offset -1.
    pub fn origin(&self, partition: i32, offset: i64) -> (i32, i64) {
        match &self.envelope {
            Some(e) => (e.origin_partition, e.origin_offset),
            None => (partition, offset),
        }
    }

    /// The envelope and headers of the copy a failure writes: the history
    /// gains the failure; on a retry tier the attempt goes up by one and the
    /// copy is due at the route's time; in the DLQ it keeps the attempts
    /// made. Key and payload are the caller's to copy as they are.
    pub fn failure_copy(
        &self,
        primary_topic: &str,
        partition: i32,
        offset: i64,
        failure: &Failure,
        consumer: Option<&str>,
    ) -> (RetryEnvelope, Vec<(String, Vec<u8>)>) {
        let mut envelope = self.envelope.clone().unwrap_or_else(|| RetryEnvelope {
            origin_topic: primary_topic.to_owned(),
            origin_partition: partition,
            origin_offset: offset,
            message_id: self.message_id.clone(),
            attempt: Attempt::FIRST,
            first_enqueued_ms: self.timestamp_ms,
            due_ms: None,
            errors: Vec::new(),
        });
        envelope.push_failure(failure.attempt, failure.at_ms, &failure.error, consumer);
        match failure.route {
            crate::lease::Route::RetryTier { due_ms, .. } => {
                envelope.attempt = failure.attempt.next();
                envelope.due_ms = Some(due_ms);
            }
            crate::lease::Route::Dlq => {
                envelope.attempt = failure.attempt;
                envelope.due_ms = None;
            }
        }
        let mut headers = self.headers.clone();
        envelope.write_into(&mut headers);
        (envelope, headers)
    }
}

/// The id of a record that names none (produced straight to the topic by a
/// plain Kafka client): stable, so its retries and DLQ copy carry the same.
pub fn derived_message_id(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}-{partition}-{offset}")
}

/// The retry tier whose delay covers `delay` (the first at least as long),
/// `None` when the longest tier is shorter.
pub fn tier_for_delay(tiers: &[Duration], delay: Duration) -> Option<usize> {
    tiers.iter().position(|&t| t >= delay)
}

/// Checks a produce request against the service limits.
pub fn validate_produce(messages: &[NewMessage], tiers: &[Duration]) -> Result<(), String> {
    if messages.is_empty() {
        return Err("no messages".into());
    }
    if messages.len() > MAX_PRODUCE_MESSAGES {
        return Err(format!(
            "{} messages; at most {MAX_PRODUCE_MESSAGES} in one request",
            messages.len()
        ));
    }
    let mut bytes = 0usize;
    for (i, m) in messages.iter().enumerate() {
        if let Some(id) = &m.message_id {
            if id.is_empty() || id.len() > MAX_MESSAGE_ID_BYTES {
                return Err(format!(
                    "messages[{i}].message_id must be 1 to {MAX_MESSAGE_ID_BYTES} bytes"
                ));
            }
        }
        if let Some((name, _)) = m.headers.iter().find(|(k, _)| k.starts_with(HEADER_PREFIX)) {
            return Err(format!(
                "messages[{i}].headers: {name:?}: the {HEADER_PREFIX}* headers are the dispatcher's"
            ));
        }
        if let Some(delay) = m.delay {
            if tier_for_delay(tiers, delay).is_none() {
                return Err(format!(
                    "messages[{i}].delay_seconds: {} s is longer than the longest retry tier ({} s)",
                    delay.as_secs_f64(),
                    tiers.last().map_or(0.0, |t| t.as_secs_f64())
                ));
            }
        }
        bytes += m.payload.len()
            + m.key.as_ref().map_or(0, Vec::len)
            + m.headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
    }
    if bytes > MAX_PRODUCE_BYTES {
        return Err(format!(
            "{bytes} bytes of messages; at most {MAX_PRODUCE_BYTES} in one request"
        ));
    }
    Ok(())
}

/// Consumer names as small slots (what a lease keeps). Slot 0 is the
/// anonymous consumer. Bounded: past `max` names, new names are anonymous.
#[derive(Debug)]
pub struct ConsumerNames {
    max: usize,
    by_name: HashMap<String, ConsumerSlot>,
    names: Vec<String>,
}

impl ConsumerNames {
    pub fn new(max: usize) -> Self {
        ConsumerNames {
            max,
            by_name: HashMap::new(),
            names: vec![String::new()],
        }
    }

    pub fn slot(&mut self, name: Option<&str>) -> ConsumerSlot {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return ConsumerSlot(0);
        };
        if let Some(&slot) = self.by_name.get(name) {
            return slot;
        }
        if self.by_name.len() >= self.max {
            return ConsumerSlot(0);
        }
        let slot = ConsumerSlot(u32::try_from(self.names.len()).expect("bounded by max"));
        self.names.push(name.to_owned());
        self.by_name.insert(name.to_owned(), slot);
        slot
    }

    /// The name of a slot; `None` for the anonymous one and for slots this
    /// instance did not hand out (a lease rebuilt from another's ack log).
    pub fn name(&self, slot: ConsumerSlot) -> Option<&str> {
        match slot.0 {
            0 => None,
            n => self.names.get(n as usize).map(String::as_str),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{FailureCause, Route};

    fn record(headers: Vec<(String, Vec<u8>)>, is_tier: bool) -> Buffered {
        Buffered::new(
            "jobs",
            2,
            7,
            Some(Bytes::from_static(b"k")),
            Bytes::from_static(b"p"),
            headers,
            1_000,
            is_tier,
        )
    }

    fn failure(route: Route) -> Failure {
        Failure {
            offset: 7,
            attempt: Attempt(1),
            consumer: ConsumerSlot(1),
            cause: FailureCause::Nacked,
            route,
            at_ms: 5_000,
            error: "boom".into(),
        }
    }

    #[test]
    fn a_plain_record_gets_a_stable_id_and_a_first_attempt() {
        let b = record(vec![("trace".into(), b"t".to_vec())], false);
        assert_eq!(b.message_id, "jobs-2-7");
        assert_eq!(b.attempt, Attempt::FIRST);
        assert_eq!(b.enqueued_at_ms(), 1_000);
        let ours = record(vec![(MESSAGE_ID_HEADER.into(), b"m-1".to_vec())], false);
        assert_eq!(ours.message_id, "m-1");
        assert!(ours.user_headers().is_empty());
        assert_eq!(ours.origin(2, 7), (2, 7));
    }

    #[test]
    fn copies_carry_the_history_and_the_next_attempt_until_the_dlq() {
        let first = record(vec![("trace".into(), b"t".to_vec())], false);
        let route = Route::RetryTier {
            tier: 0,
            due_ms: 6_000,
        };
        let (env, headers) = first.failure_copy("jobs", 2, 7, &failure(route), Some("w1"));
        assert_eq!(env.attempt, Attempt(2));
        assert_eq!(env.due_ms, Some(6_000));
        assert_eq!((env.origin_partition, env.origin_offset), (2, 7));
        assert_eq!(env.message_id, "jobs-2-7");
        assert_eq!(env.errors[0].consumer.as_deref(), Some("w1"));
        // The tier copy, read back: attempt 2, due, same id, user header kept.
        let tier = Buffered::new(
            "jobs.retry.1s",
            0,
            0,
            None,
            Bytes::new(),
            headers,
            5_001,
            true,
        );
        assert_eq!(tier.attempt, Attempt(2));
        assert_eq!(tier.due_ms, Some(6_000));
        assert_eq!(tier.message_id, "jobs-2-7");
        assert_eq!(tier.enqueued_at_ms(), 1_000);
        assert_eq!(
            tier.user_headers(),
            vec![("trace".to_owned(), b"t".to_vec())]
        );
        assert_eq!(tier.origin(0, 0), (2, 7));
        let mut f = failure(Route::Dlq);
        f.attempt = Attempt(2);
        let (dlq, _) = tier.failure_copy("jobs", 0, 0, &f, None);
        assert_eq!(dlq.attempt, Attempt(2));
        assert_eq!(dlq.due_ms, None);
        assert_eq!(dlq.errors.len(), 2);
    }

    #[test]
    fn the_due_time_holds_only_on_a_tier() {
        let env = RetryEnvelope {
            origin_topic: "jobs".into(),
            origin_partition: 0,
            origin_offset: 1,
            message_id: "m".into(),
            attempt: Attempt(3),
            first_enqueued_ms: 1,
            due_ms: Some(99),
            errors: vec![],
        };
        assert_eq!(record(env.to_headers(), true).due_ms, Some(99));
        assert_eq!(record(env.to_headers(), false).due_ms, None);
        assert_eq!(record(env.to_headers(), false).attempt, Attempt(3));
    }

    #[test]
    fn produce_limits_are_checked() {
        let tiers = [Duration::from_secs(1), Duration::from_secs(10)];
        let msg = |f: &dyn Fn(&mut NewMessage)| {
            let mut m = NewMessage {
                message_id: None,
                key: None,
                payload: b"x".to_vec(),
                headers: vec![],
                delay: None,
            };
            f(&mut m);
            vec![m]
        };
        assert!(validate_produce(&msg(&|_| {}), &tiers).is_ok());
        assert!(validate_produce(&[], &tiers).is_err());
        assert!(validate_produce(&vec![msg(&|_| {}).remove(0); 501], &tiers).is_err());
        assert!(validate_produce(
            &msg(&|m| m.payload = vec![0; MAX_PRODUCE_BYTES + 1]),
            &tiers
        )
        .is_err());
        assert!(validate_produce(&msg(&|m| m.message_id = Some("i".repeat(257))), &tiers).is_err());
        assert!(validate_produce(&msg(&|m| m.message_id = Some("i".repeat(256))), &tiers).is_ok());
        assert!(
            validate_produce(&msg(&|m| m.delay = Some(Duration::from_secs(11))), &tiers).is_err()
        );
        assert!(
            validate_produce(&msg(&|m| m.delay = Some(Duration::from_secs(10))), &tiers).is_ok()
        );
        assert!(validate_produce(
            &msg(&|m| m.headers = vec![("dispatcher.attempt".into(), vec![])]),
            &tiers
        )
        .is_err());
        assert_eq!(tier_for_delay(&tiers, Duration::from_millis(1500)), Some(1));
    }

    #[test]
    fn consumer_names_are_bounded_and_anonymous_is_slot_zero() {
        let mut n = ConsumerNames::new(2);
        assert_eq!(n.slot(None), ConsumerSlot(0));
        assert_eq!(n.slot(Some("")), ConsumerSlot(0));
        let a = n.slot(Some("a"));
        assert_eq!(n.slot(Some("a")), a);
        let b = n.slot(Some("b"));
        assert_ne!(a, b);
        assert_eq!(n.slot(Some("c")), ConsumerSlot(0));
        assert_eq!(n.name(a), Some("a"));
        assert_eq!(n.name(ConsumerSlot(0)), None);
        assert_eq!(n.name(ConsumerSlot(9)), None);
    }
}
