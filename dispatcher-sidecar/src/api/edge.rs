//! The checks both transports make before calling the service, so the
//! limits of [`crate::service`] hold whichever way a request came in, and
//! the two APIs answer an over-limit request with the same message.

use std::time::Duration;

use crate::service::{
    NackRequest, NewMessage, ReceiveRequest, ServiceError, SkipRequest, MAX_CONSUMER_ID_BYTES,
    MAX_PRODUCE_BYTES, MAX_PRODUCE_MESSAGES, MAX_RECEIVE_MESSAGES, MAX_RECEIVE_WAIT,
};

/// How many messages a receive asks for when it does not say.
pub const DEFAULT_RECEIVE_MESSAGES: u32 = 10;
/// At most this many receipts in one ack: ten full receives.
pub const MAX_ACK_RECEIPTS: usize = 1000;
/// A nack's error text is cut to this many bytes (at a character
/// boundary) rather than rejected: a worker reporting a failure should not
/// fail again because its error message was long.
pub const MAX_NACK_ERROR_BYTES: usize = 4096;

fn invalid(message: String) -> ServiceError {
    ServiceError::InvalidArgument(message)
}

/// A produce batch: 1..=500 messages, at most 1 MiB of keys, payloads and
/// headers (names and values), and no empty message id.
pub(crate) fn check_produce(messages: &[NewMessage]) -> Result<(), ServiceError> {
    if messages.is_empty() {
        return Err(invalid("messages: at least one message is required".into()));
    }
    if messages.len() > MAX_PRODUCE_MESSAGES {
        return Err(invalid(format!(
            "messages: at most {MAX_PRODUCE_MESSAGES} messages per request, got {}",
            messages.len()
        )));
    }
    if let Some(i) = messages
        .iter()
        .position(|m| m.message_id.as_deref() == Some(""))
    {
        return Err(invalid(format!(
            "messages[{i}].message_id: must not be empty (omit it to have one generated)"
        )));
    }
    let bytes: usize = messages.iter().map(message_bytes).sum();
    if bytes > MAX_PRODUCE_BYTES {
        return Err(invalid(format!(
            "messages: at most {MAX_PRODUCE_BYTES} bytes of keys, payloads and headers per \
             request, got {bytes}"
        )));
    }
    Ok(())
}

fn message_bytes(message: &NewMessage) -> usize {
    let key = message.key.as_ref().map_or(0, Vec::len);
    let headers: usize = message
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    key + message.payload.len() + headers
}

/// A receive's parameters as they came in, each optional.
#[derive(Debug, Default)]
pub(crate) struct ReceiveParams {
    pub max_messages: Option<u32>,
    pub wait_seconds: Option<u64>,
    pub lease_seconds: Option<u64>,
    pub consumer_id: Option<String>,
}

/// Applies the defaults (10 messages, no wait, the queue's lease) and the
/// limits (1..=100 messages, wait ≤ 20 s, lease ≥ 1 s, consumer id ≤ 128
/// bytes).
pub(crate) fn receive_request(params: ReceiveParams) -> Result<ReceiveRequest, ServiceError> {
    let max_messages = params.max_messages.unwrap_or(DEFAULT_RECEIVE_MESSAGES);
    if !(1..=MAX_RECEIVE_MESSAGES).contains(&max_messages) {
        return Err(invalid(format!(
            "max_messages: must be 1..={MAX_RECEIVE_MESSAGES}, got {max_messages}"
        )));
    }
    let wait_seconds = params.wait_seconds.unwrap_or(0);
    let max_wait_seconds = MAX_RECEIVE_WAIT.as_secs();
    if wait_seconds > max_wait_seconds {
        return Err(invalid(format!(
            "wait_seconds: must be 0..={max_wait_seconds}, got {wait_seconds}"
        )));
    }
    let lease = params
        .lease_seconds
        .map(|s| lease_duration("lease_seconds", s))
        .transpose()?;
    if let Some(id) = &params.consumer_id {
        if id.len() > MAX_CONSUMER_ID_BYTES {
            return Err(invalid(format!(
                "consumer_id: at most {MAX_CONSUMER_ID_BYTES} bytes, got {}",
                id.len()
            )));
        }
    }
    Ok(ReceiveRequest {
        max_messages,
        wait: Duration::from_secs(wait_seconds),
        lease,
        consumer: params.consumer_id,
    })
}

/// A lease length: at least one second (the service caps it by the queue's
/// maximum total lease).
pub(crate) fn lease_duration(field: &str, seconds: u64) -> Result<Duration, ServiceError> {
    if seconds == 0 {
        return Err(invalid(format!("{field}: must be at least 1")));
    }
    Ok(Duration::from_secs(seconds))
}

/// An ack's receipts: 1..=1000.
pub(crate) fn check_receipts(receipts: &[String]) -> Result<(), ServiceError> {
    if receipts.is_empty() {
        return Err(invalid("receipts: at least one receipt is required".into()));
    }
    if receipts.len() > MAX_ACK_RECEIPTS {
        return Err(invalid(format!(
            "receipts: at most {MAX_ACK_RECEIPTS} receipts per request, got {}",
            receipts.len()
        )));
    }
    Ok(())
}

/// A nack, with its error text cut to [`MAX_NACK_ERROR_BYTES`].
pub(crate) fn nack_request(
    receipt: String,
    retry_after_seconds: Option<u64>,
    error: Option<String>,
    permanent: bool,
) -> NackRequest {
    NackRequest {
        receipt,
        retry_after: retry_after_seconds.map(Duration::from_secs),
        error: error.map(|e| truncate(e, MAX_NACK_ERROR_BYTES)),
        permanent,
    }
}

/// A skip names the message its key is parked by: not empty.
pub(crate) fn skip_request(
    partition: i32,
    key: Vec<u8>,
    message_id: String,
) -> Result<SkipRequest, ServiceError> {
    if message_id.is_empty() {
        return Err(invalid("message_id must not be empty".into()));
    }
    Ok(SkipRequest {
        partition,
        key,
        message_id,
    })
}

/// A skip whose partition's owner could not be asked, in both APIs' words.
pub(crate) const SKIP_OWNER_UNREACHED: &str =
    "the partition's owner could not be reached (a rebalance?); retry";

/// Why a trace found nothing, in both APIs' words.
pub(crate) fn unknown_message(message_id: &str, queue: Option<&str>) -> String {
    let who = match queue {
        Some(q) => format!("queue {q:?} knows no message {message_id:?}"),
        None => format!("no queue of this dispatcher knows message {message_id:?}"),
    };
    format!(
        "{who}: it was never produced there, or its index entry left retention, \
         or a derived id (<topic>-<partition>-<offset>) names no record"
    )
}

fn truncate(mut text: String, max_bytes: usize) -> String {
    if text.len() > max_bytes {
        let mut end = max_bytes;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: usize) -> NewMessage {
        NewMessage {
            message_id: None,
            key: Some(vec![0; 10]),
            payload: vec![0; payload],
            headers: vec![("h".into(), vec![0; 5])],
            delay: None,
        }
    }

    #[test]
    fn produce_bytes_count_key_payload_and_headers() {
        let exact = message(MAX_PRODUCE_BYTES - 16);
        assert_eq!(check_produce(std::slice::from_ref(&exact)), Ok(()));
        let over = message(MAX_PRODUCE_BYTES - 15);
        assert!(matches!(
            check_produce(&[over]),
            Err(ServiceError::InvalidArgument(m)) if m.contains("bytes")
        ));
    }

    #[test]
    fn receive_defaults() {
        let r = receive_request(ReceiveParams::default()).unwrap();
        assert_eq!(r.max_messages, DEFAULT_RECEIVE_MESSAGES);
        assert_eq!(r.wait, Duration::ZERO);
        assert_eq!(r.lease, None);
        assert_eq!(r.consumer, None);
    }

    #[test]
    fn receive_limits_are_inclusive() {
        let at_limits = ReceiveParams {
            max_messages: Some(MAX_RECEIVE_MESSAGES),
            wait_seconds: Some(20),
            lease_seconds: Some(1),
            consumer_id: Some("c".repeat(MAX_CONSUMER_ID_BYTES)),
        };
        assert!(receive_request(at_limits).is_ok());
        for params in [
            ReceiveParams {
                max_messages: Some(0),
                ..Default::default()
            },
            ReceiveParams {
                wait_seconds: Some(21),
                ..Default::default()
            },
            ReceiveParams {
                lease_seconds: Some(0),
                ..Default::default()
            },
            ReceiveParams {
                consumer_id: Some("c".repeat(MAX_CONSUMER_ID_BYTES + 1)),
                ..Default::default()
            },
        ] {
            assert!(receive_request(params).is_err());
        }
    }

    #[test]
    fn nack_error_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_NACK_ERROR_BYTES); // two bytes each
        let nack = nack_request("r".into(), None, Some(long + "x"), false);
        let error = nack.error.unwrap();
        assert_eq!(error.len(), MAX_NACK_ERROR_BYTES);
        assert!(error.chars().all(|c| c == 'é'));
        let odd = format!("x{}", "é".repeat(MAX_NACK_ERROR_BYTES));
        let nack = nack_request("r".into(), None, Some(odd), false);
        assert_eq!(nack.error.unwrap().len(), MAX_NACK_ERROR_BYTES - 1);
    }
}
