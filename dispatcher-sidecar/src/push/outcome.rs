//! What a push's answer means for the message: ack, retry (through the
//! retry tiers, honouring `Retry-After`) or dead-letter at once. Pure: the
//! clients in `http.rs` and `grpc.rs` turn their answers into these inputs.

use std::time::{Duration, SystemTime};

/// At most this many bytes of an endpoint's answer are kept in the
/// message's failure history.
pub const MAX_KEPT_BODY_BYTES: usize = 1024;

/// What to do with a pushed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint took it: ack.
    Ack,
    /// The endpoint refused this message for good: DLQ at once, with
    /// `error` in its history.
    DeadLetter { error: String },
    /// The endpoint could not take it now: nack for a retry tier, no sooner
    /// than `retry_after` when the endpoint said so.
    Retry {
        kind: RetryKind,
        retry_after: Option<Duration>,
        error: String,
    },
}

/// Why a push is retried: the `outcome` label of
/// `dispatcher_push_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryKind {
    /// The endpoint answered with a retryable status.
    Status,
    /// No answer within the push timeout.
    Timeout,
    /// No answer at all: connection refused or reset, DNS, protocol error.
    Transport,
}

impl Outcome {
    /// A failure of the endpoint rather than of the message: what the
    /// circuit breaker counts. A dead letter is the endpoint working.
    pub fn endpoint_failed(&self) -> bool {
        matches!(self, Outcome::Retry { .. })
    }

    /// The `outcome` label of `dispatcher_push_requests_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::DeadLetter { .. } => "dlq",
            Outcome::Retry { kind, .. } => match kind {
                RetryKind::Status => "retry",
                RetryKind::Timeout => "timeout",
                RetryKind::Transport => "error",
            },
        }
    }

    pub fn timeout(timeout: Duration) -> Outcome {
        Outcome::Retry {
            kind: RetryKind::Timeout,
            retry_after: None,
            error: format!(
                "push: no answer within {}",
                crate::config::format_duration(timeout)
            ),
        }
    }

    pub fn transport(error: &str) -> Outcome {
        Outcome::Retry {
            kind: RetryKind::Transport,
            retry_after: None,
            error: format!("push: {error}"),
        }
    }
}

/// An HTTP answer: 2xx acks; 408, 429 and 5xx retry (after `Retry-After`
/// when given); any other 4xx is permanent. A 1xx or 3xx (redirects are not
/// followed: a POST must not turn into a GET) is a misconfigured endpoint,
/// not a bad message: retried, and counted by the breaker.
pub fn http_outcome(
    status: u16,
    reason: Option<&str>,
    retry_after: Option<&str>,
    body: &[u8],
    now: SystemTime,
) -> Outcome {
    let error = || {
        let mut e = format!("push: HTTP {status}");
        if let Some(reason) = reason {
            e.push(' ');
            e.push_str(reason);
        }
        let body = String::from_utf8_lossy(&body[..body.len().min(MAX_KEPT_BODY_BYTES)]);
        let body = body.trim();
        if !body.is_empty() {
            e.push_str(": ");
            e.push_str(body);
        }
        e
    };
    match status {
        200..=299 => Outcome::Ack,
        408 | 429 => retry_status(error(), retry_after, now),
        400..=499 => Outcome::DeadLetter { error: error() },
        _ => retry_status(error(), retry_after, now),
    }
}

fn retry_status(error: String, retry_after: Option<&str>, now: SystemTime) -> Outcome {
    Outcome::Retry {
        kind: RetryKind::Status,
        retry_after: retry_after.and_then(|v| parse_retry_after(v, now)),
        error,
    }
}

/// `Retry-After` (RFC 9110 10.2.3): whole seconds, or an HTTP-date (a date
/// in the past is 0). Anything else is ignored (`None`): the retry tier for
/// the attempt decides.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A gRPC status (code as in `tonic::Code`): OK acks; codes that say the
/// message itself is wrong dead-letter; codes that say the endpoint cannot
/// take it now retry. `retry_after` is the `retry-after` metadata of the
/// answer (seconds), if any.
///
/// The table follows the HTTP mapping of each code (gRPC's
/// `statuscodes.md`), so both kinds of endpoint are treated alike:
/// 4xx-like codes are permanent, except the ones that mean "later".
pub fn grpc_outcome(code: tonic::Code, message: &str, retry_after: Option<&str>) -> Outcome {
    use tonic::Code;
    let error = || {
        if message.is_empty() {
            format!("push: gRPC {code:?}")
        } else {
            let cut = &message[..floor_char_boundary(message, MAX_KEPT_BODY_BYTES)];
            format!("push: gRPC {code:?}: {cut}")
        }
    };
    let retry = || Outcome::Retry {
        kind: RetryKind::Status,
        retry_after: retry_after.and_then(|v| parse_retry_after(v, SystemTime::now())),
        error: error(),
    };
    // No `_ =>` arm: a new code does not compile until someone decides it.
    match code {
        Code::Ok => Outcome::Ack,
        // The message is wrong, or the endpoint will never accept it.
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::NotFound
        | Code::AlreadyExists
        | Code::OutOfRange
        | Code::PermissionDenied
        | Code::Unauthenticated => Outcome::DeadLetter { error: error() },
        // Not now: overloaded, down, too slow, or failed inside.
        Code::Unavailable
        | Code::ResourceExhausted
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal
        | Code::DataLoss
        | Code::Unimplemented => retry(),
    }
}

/// The largest index ≤ `max` that is a character boundary of `s`.
fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        // 2026-12-03T07:14:00Z
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_282_040)
    }

    #[test]
    fn http_statuses_map_to_outcomes() {
        assert_eq!(
            http_outcome(200, Some("OK"), None, b"", now()),
            Outcome::Ack
        );
        assert_eq!(http_outcome(204, None, None, b"", now()), Outcome::Ack);
        assert_eq!(
            http_outcome(400, Some("Bad Request"), None, b" no such order \n", now()),
            Outcome::DeadLetter {
                error: "push: HTTP 400 Bad Request: no such order".into()
            }
        );
        for permanent in [401, 403, 404, 409, 410, 413, 422, 499] {
            let o = http_outcome(permanent, None, Some("5"), b"", now());
            assert_eq!(o.label(), "dlq", "{permanent}");
            assert!(!o.endpoint_failed());
        }
        for retried in [408, 429, 500, 502, 503, 504, 599, 301, 302, 101] {
            let o = http_outcome(retried, None, None, b"", now());
            assert_eq!(o.label(), "retry", "{retried}");
            assert!(o.endpoint_failed(), "{retried}");
        }
        assert_eq!(
            http_outcome(503, Some("Service Unavailable"), Some("30"), b"busy", now()),
            Outcome::Retry {
                kind: RetryKind::Status,
                retry_after: Some(Duration::from_secs(30)),
                error: "push: HTTP 503 Service Unavailable: busy".into()
            }
        );
        assert_eq!(http_outcome(200, None, None, b"", now()).label(), "ack");
    }

    #[test]
    fn a_long_body_is_cut_for_the_history() {
        let body = vec![b'x'; 10 * MAX_KEPT_BODY_BYTES];
        let Outcome::DeadLetter { error } = http_outcome(400, None, None, &body, now()) else {
            panic!("400 is permanent")
        };
        assert_eq!(error.len(), "push: HTTP 400: ".len() + MAX_KEPT_BODY_BYTES);
        // Bytes that are not UTF-8 are replaced, not refused.
        let Outcome::DeadLetter { error } = http_outcome(422, None, None, &[0xff, b'a'], now())
        else {
            panic!("422 is permanent")
        };
        assert_eq!(error, "push: HTTP 422: \u{fffd}a");
    }

    #[test]
    fn retry_after_takes_seconds_or_an_http_date() {
        assert_eq!(
            parse_retry_after("120", now()),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now()), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Thu, 03 Dec 2026 07:14:45 GMT", now()),
            Some(Duration::from_secs(45))
        );
        // A date in the past: no wait.
        assert_eq!(
            parse_retry_after("Thu, 03 Dec 2026 07:00:00 GMT", now()),
            Some(Duration::ZERO)
        );
        for bad in ["", "-5", "1.5", "soon", "99999999999999999999999"] {
            assert_eq!(parse_retry_after(bad, now()), None, "{bad:?}");
        }
        let Outcome::Retry { retry_after, .. } =
            http_outcome(429, None, Some("Thu, 03 Dec 2026 07:15:00 GMT"), b"", now())
        else {
            panic!("429 retries")
        };
        assert_eq!(retry_after, Some(Duration::from_secs(60)));
        let Outcome::Retry { retry_after, .. } = http_outcome(429, None, Some("later"), b"", now())
        else {
            panic!("429 retries")
        };
        assert_eq!(retry_after, None, "an unreadable Retry-After is ignored");
    }

    #[test]
    fn grpc_codes_map_to_outcomes() {
        use tonic::Code;
        assert_eq!(grpc_outcome(Code::Ok, "", None), Outcome::Ack);
        for code in [
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::NotFound,
            Code::AlreadyExists,
            Code::OutOfRange,
            Code::PermissionDenied,
            Code::Unauthenticated,
        ] {
            assert_eq!(grpc_outcome(code, "m", None).label(), "dlq", "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::ResourceExhausted,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
            Code::DataLoss,
            Code::Unimplemented,
        ] {
            assert_eq!(grpc_outcome(code, "m", None).label(), "retry", "{code:?}");
        }
        assert_eq!(
            grpc_outcome(Code::NotFound, "no order 42", None),
            Outcome::DeadLetter {
                error: "push: gRPC NotFound: no order 42".into()
            }
        );
        let Outcome::Retry { retry_after, .. } =
            grpc_outcome(Code::ResourceExhausted, "", Some("7"))
        else {
            panic!("RESOURCE_EXHAUSTED retries")
        };
        assert_eq!(retry_after, Some(Duration::from_secs(7)));
        let long = "é".repeat(MAX_KEPT_BODY_BYTES);
        let Outcome::DeadLetter { error } = grpc_outcome(Code::InvalidArgument, &long, None) else {
            panic!()
        };
        assert_eq!(
            error.len(),
            "push: gRPC InvalidArgument: ".len() + MAX_KEPT_BODY_BYTES
        );
    }

    #[test]
    fn timeouts_and_transport_errors_retry_and_count_against_the_endpoint() {
        let t = Outcome::timeout(Duration::from_millis(1500));
        assert_eq!(t.label(), "timeout");
        assert!(t.endpoint_failed());
        let Outcome::Retry { error, .. } = &t else {
            panic!()
        };
        assert_eq!(error, "push: no answer within 1500ms");
        let e = Outcome::transport("connection refused");
        assert_eq!(e.label(), "error");
        assert!(e.endpoint_failed());
    }
}
