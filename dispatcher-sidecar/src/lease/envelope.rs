//! The envelope of a copy sent to a retry tier or the DLQ, as Kafka headers.
//!
//! The copy keeps the original key, value and headers; the dispatcher adds
//! `dispatcher.*` headers naming where the message came from, which attempt
//! the copy is, when it was first enqueued, when a tier may release it, and
//! every failure so far. Numbers are decimal text and the history is JSON,
//! so an operator reading a DLQ with any Kafka tool can read them.

use serde::{Deserialize, Serialize};

use super::{cut_at_char, Attempt, MAX_ERROR_BYTES};

pub const HEADER_PREFIX: &str = "dispatcher.";
const TOPIC: &str = "dispatcher.origin-topic";
const PARTITION: &str = "dispatcher.origin-partition";
const OFFSET: &str = "dispatcher.origin-offset";
const MESSAGE_ID: &str = "dispatcher.message-id";
const ATTEMPT: &str = "dispatcher.attempt";
const FIRST_ENQUEUED: &str = "dispatcher.first-enqueued-ms";
const DUE: &str = "dispatcher.due-ms";
const ERRORS: &str = "dispatcher.errors";

/// Envelopes carry at most this many failures (the newest): the history of a
/// message redriven many times must not grow without bound.
pub const MAX_HISTORY: usize = 32;
const MAX_CONSUMER_BYTES: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub attempt: u16,
    pub at_ms: i64,
    pub error: String,
    /// The consumer that held the lease, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryEnvelope {
    /// Where the message was first produced.
    pub origin_topic: String,
    pub origin_partition: i32,
    pub origin_offset: i64,
    pub message_id: String,
    /// The attempt this copy is delivered as.
    pub attempt: Attempt,
    pub first_enqueued_ms: i64,
    /// When a retry tier may release the copy (absent on the DLQ).
    pub due_ms: Option<i64>,
    /// Oldest first.
    pub errors: Vec<FailureRecord>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("header {0} missing")]
    Missing(&'static str),
    #[error("header {0} is not valid")]
    Invalid(&'static str),
}

impl RetryEnvelope {
    /// Appends a failure, keeping the newest `MAX_HISTORY`.
    pub fn push_failure(
        &mut self,
        attempt: Attempt,
        at_ms: i64,
        error: &str,
        consumer: Option<&str>,
    ) {
        self.errors.push(FailureRecord {
            attempt: attempt.0,
            at_ms,
            error: cut_at_char(error, MAX_ERROR_BYTES).to_owned(),
            consumer: consumer.map(|c| cut_at_char(c, MAX_CONSUMER_BYTES).to_owned()),
        });
        if self.errors.len() > MAX_HISTORY {
            self.errors.drain(..self.errors.len() - MAX_HISTORY);
        }
    }

    pub fn to_headers(&self) -> Vec<(String, Vec<u8>)> {
        let mut headers = vec![
            (TOPIC.to_owned(), self.origin_topic.clone().into_bytes()),
            (
                PARTITION.to_owned(),
                self.origin_partition.to_string().into_bytes(),
            ),
            (
                OFFSET.to_owned(),
                self.origin_offset.to_string().into_bytes(),
            ),
            (MESSAGE_ID.to_owned(), self.message_id.clone().into_bytes()),
            (ATTEMPT.to_owned(), self.attempt.0.to_string().into_bytes()),
            (
                FIRST_ENQUEUED.to_owned(),
                self.first_enqueued_ms.to_string().into_bytes(),
            ),
        ];
        if let Some(due_ms) = self.due_ms {
            headers.push((DUE.to_owned(), due_ms.to_string().into_bytes()));
        }
        headers.push((
            ERRORS.to_owned(),
            serde_json::to_vec(&self.errors).expect("plain data serializes"),
        ));
        headers
    }

    /// Replaces any `dispatcher.*` headers in `headers` (a message's own,
    /// perhaps from an earlier tier) with this envelope's, keeping the rest.
    pub fn write_into(&self, headers: &mut Vec<(String, Vec<u8>)>) {
        headers.retain(|(name, _)| !name.starts_with(HEADER_PREFIX));
        headers.extend(self.to_headers());
    }

    /// Reads the envelope from a record's headers; `Ok(None)` when the record
    /// carries none (a message straight from the source topic). The last
    /// occurrence of a repeated header wins.
    pub fn from_headers(headers: &[(String, Vec<u8>)]) -> Result<Option<Self>, EnvelopeError> {
        let get = |name: &'static str| {
            headers
                .iter()
                .rev()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
        };
        if !headers.iter().any(|(n, _)| n.starts_with(HEADER_PREFIX)) {
            return Ok(None);
        }
        let text = |name: &'static str| -> Result<&str, EnvelopeError> {
            let bytes = get(name).ok_or(EnvelopeError::Missing(name))?;
            std::str::from_utf8(bytes).map_err(|_| EnvelopeError::Invalid(name))
        };
        fn number<T: std::str::FromStr>(name: &'static str, s: &str) -> Result<T, EnvelopeError> {
            s.parse().map_err(|_| EnvelopeError::Invalid(name))
        }
        let due_ms = match get(DUE) {
            None => None,
            Some(_) => Some(number(DUE, text(DUE)?)?),
        };
        let errors: Vec<FailureRecord> =
            serde_json::from_slice(get(ERRORS).ok_or(EnvelopeError::Missing(ERRORS))?)
                .map_err(|_| EnvelopeError::Invalid(ERRORS))?;
        if errors.len() > MAX_HISTORY {
            return Err(EnvelopeError::Invalid(ERRORS));
        }
        Ok(Some(RetryEnvelope {
            origin_topic: text(TOPIC)?.to_owned(),
            origin_partition: number(PARTITION, text(PARTITION)?)?,
            origin_offset: number(OFFSET, text(OFFSET)?)?,
            message_id: text(MESSAGE_ID)?.to_owned(),
            attempt: Attempt(number(ATTEMPT, text(ATTEMPT)?)?),
            first_enqueued_ms: number(FIRST_ENQUEUED, text(FIRST_ENQUEUED)?)?,
            due_ms,
            errors,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> RetryEnvelope {
        let mut e = RetryEnvelope {
            origin_topic: "orders".into(),
            origin_partition: 2,
            origin_offset: 981,
            message_id: "01890a5d-ac96-774b-bcce-b302099a8057".into(),
            attempt: Attempt(3),
            first_enqueued_ms: 1_700_000_000_000,
            due_ms: Some(1_700_000_070_000),
            errors: Vec::new(),
        };
        e.push_failure(
            Attempt(1),
            1_700_000_000_500,
            "lease expired",
            Some("worker-7"),
        );
        e.push_failure(Attempt(2), 1_700_000_010_900, "HTTP 503 \"busy\"\n", None);
        e
    }

    #[test]
    fn an_envelope_round_trips_through_headers() {
        let e = envelope();
        let headers = e.to_headers();
        assert!(headers.iter().all(|(n, _)| n.starts_with(HEADER_PREFIX)));
        assert_eq!(RetryEnvelope::from_headers(&headers), Ok(Some(e.clone())));

        let dlq = RetryEnvelope { due_ms: None, ..e };
        assert_eq!(
            RetryEnvelope::from_headers(&dlq.to_headers()),
            Ok(Some(dlq))
        );
    }

    #[test]
    fn writing_an_envelope_replaces_the_previous_one_and_keeps_user_headers() {
        let mut headers = vec![("trace".to_owned(), b"abc".to_vec())];
        let mut e = envelope();
        e.write_into(&mut headers);
        e.attempt = Attempt(4);
        e.push_failure(Attempt(3), 1_700_000_080_000, "boom", Some("w"));
        e.write_into(&mut headers);
        assert_eq!(headers[0], ("trace".to_owned(), b"abc".to_vec()));
        assert_eq!(headers.len(), 1 + e.to_headers().len());
        assert_eq!(RetryEnvelope::from_headers(&headers), Ok(Some(e)));
    }

    #[test]
    fn missing_or_bad_headers_are_reported_and_plain_records_have_none() {
        assert_eq!(
            RetryEnvelope::from_headers(&[("trace".to_owned(), vec![])]),
            Ok(None)
        );
        let mut headers = envelope().to_headers();
        headers.retain(|(n, _)| n != ATTEMPT);
        assert_eq!(
            RetryEnvelope::from_headers(&headers),
            Err(EnvelopeError::Missing(ATTEMPT))
        );
        let mut headers = envelope().to_headers();
        headers.push((OFFSET.to_owned(), b"12x".to_vec()));
        assert_eq!(
            RetryEnvelope::from_headers(&headers),
            Err(EnvelopeError::Invalid(OFFSET))
        );
        let mut headers = envelope().to_headers();
        headers.push((ERRORS.to_owned(), b"{".to_vec()));
        assert_eq!(
            RetryEnvelope::from_headers(&headers),
            Err(EnvelopeError::Invalid(ERRORS))
        );
    }

    #[test]
    fn the_history_keeps_the_newest_failures() {
        let mut e = envelope();
        for i in 0..100 {
            e.push_failure(
                Attempt(i),
                i64::from(i),
                &format!("x{}", "é".repeat(5000)),
                Some(&format!("x{}", "ü".repeat(500))),
            );
        }
        assert_eq!(e.errors.len(), MAX_HISTORY);
        assert_eq!(e.errors.last().unwrap().attempt, 99);
        // Cut at the char boundary below the limit ("x", then 2-byte chars).
        assert_eq!(e.errors[0].error.len(), MAX_ERROR_BYTES - 1);
        assert_eq!(
            e.errors[0].consumer.as_ref().unwrap().len(),
            MAX_CONSUMER_BYTES - 1
        );
    }
}
