//! The HTTP API's JSON bodies (the schemas of `openapi.yaml`) and their
//! translation to and from the service's types.
//!
//! Keys, payloads and header values are bytes; JSON carries them as strings
//! in the message's `encoding`: `utf8` (the default; the string is the
//! bytes) or `base64` (standard alphabet, padded). A delivery is `utf8` when
//! its key, payload and every header value are valid UTF-8 and `base64`
//! otherwise, unless the receive asked for `base64` throughout. Times are
//! RFC 3339 in UTC with milliseconds.

use std::borrow::Cow;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize, Serializer};

use crate::config::{format_duration, PushConfig, PushEndpoint, QueueConfig};
use crate::service::{
    Delivery, ExtendResult, NewMessage, PartitionStats, ProduceResult, ProduceStatus, QueueStats,
    ReceiptOutcome, ServiceError,
};

/// How a message's key, payload and header values are written as JSON
/// strings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// What encoding a receive wants its deliveries in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DeliveryEncoding {
    /// `utf8` where the bytes are UTF-8, `base64` otherwise (per message).
    #[default]
    Auto,
    Base64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Header {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProduceBody {
    pub messages: Vec<MessageIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageIn {
    message_id: Option<String>,
    key: Option<String>,
    payload: String,
    #[serde(default)]
    headers: Vec<Header>,
    delay_seconds: Option<u64>,
    #[serde(default)]
    encoding: Encoding,
}

impl MessageIn {
    /// Decodes the byte fields; `index` names the message in an error.
    pub(crate) fn into_new_message(self, index: usize) -> Result<NewMessage, ServiceError> {
        let field = |name: &str| format!("messages[{index}].{name}");
        let encoding = self.encoding;
        let key = self
            .key
            .map(|k| decode(&field("key"), k, encoding))
            .transpose()?;
        let payload = decode(&field("payload"), self.payload, encoding)?;
        let headers = self
            .headers
            .into_iter()
            .enumerate()
            .map(|(h, header)| {
                let value = decode(
                    &field(&format!("headers[{h}].value")),
                    header.value,
                    encoding,
                )?;
                Ok((header.name, value))
            })
            .collect::<Result<_, ServiceError>>()?;
        Ok(NewMessage {
            message_id: self.message_id,
            key,
            payload,
            headers,
            delay: self.delay_seconds.map(std::time::Duration::from_secs),
        })
    }
}

fn decode(field: &str, text: String, encoding: Encoding) -> Result<Vec<u8>, ServiceError> {
    match encoding {
        Encoding::Utf8 => Ok(text.into_bytes()),
        Encoding::Base64 => BASE64
            .decode(text.as_bytes())
            .map_err(|e| ServiceError::InvalidArgument(format!("{field}: not valid base64: {e}"))),
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct ProduceResponse {
    pub results: Vec<ProduceResultOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProduceResultOut {
    message_id: String,
    status: &'static str,
    partition: i32,
    offset: i64,
}

impl From<ProduceResult> for ProduceResultOut {
    fn from(r: ProduceResult) -> Self {
        ProduceResultOut {
            message_id: r.message_id,
            status: match r.status {
                ProduceStatus::Accepted => "accepted",
                ProduceStatus::Duplicate => "duplicate",
            },
            partition: r.partition,
            offset: r.offset,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReceiveBody {
    pub max_messages: Option<u32>,
    pub wait_seconds: Option<u64>,
    pub lease_seconds: Option<u64>,
    pub consumer_id: Option<String>,
    #[serde(default)]
    pub encoding: DeliveryEncoding,
}

#[derive(Debug, Serialize)]
pub(crate) struct ReceiveResponse {
    pub messages: Vec<DeliveryOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DeliveryOut {
    message_id: String,
    receipt: String,
    key: Option<Text>,
    payload: Text,
    headers: Vec<Header>,
    encoding: Encoding,
    attempt: u32,
    enqueued_at: String,
    partition: i32,
    offset: i64,
    lease_expires_at: String,
}

impl DeliveryOut {
    pub(crate) fn new(d: Delivery, wanted: DeliveryEncoding) -> Self {
        let encoding = match wanted {
            DeliveryEncoding::Base64 => Encoding::Base64,
            DeliveryEncoding::Auto if all_utf8(&d) => Encoding::Utf8,
            DeliveryEncoding::Auto => Encoding::Base64,
        };
        DeliveryOut {
            message_id: d.message_id,
            receipt: d.receipt,
            key: d.key.map(|k| Text(k, encoding)),
            payload: Text(d.payload, encoding),
            headers: d
                .headers
                .into_iter()
                .map(|(name, value)| Header {
                    name,
                    value: encode(value, encoding),
                })
                .collect(),
            encoding,
            attempt: d.attempt,
            enqueued_at: rfc3339_ms(d.enqueued_at_ms),
            partition: d.partition,
            offset: d.offset,
            lease_expires_at: rfc3339_ms(d.lease_expires_at_ms),
        }
    }
}

fn all_utf8(d: &Delivery) -> bool {
    let utf8 = |b: &[u8]| std::str::from_utf8(b).is_ok();
    d.key.as_deref().is_none_or(utf8) && utf8(&d.payload) && d.headers.iter().all(|(_, v)| utf8(v))
}

/// A delivery's key or payload as a JSON string in its encoding, written
/// straight from the bytes the dispatcher holds (a UTF-8 payload is not
/// copied into a `String` first).
#[derive(Debug)]
pub(crate) struct Text(Bytes, Encoding);

impl Text {
    /// Only `Utf8` on bytes checked by [`all_utf8`] borrows.
    fn as_text(&self) -> Cow<'_, str> {
        match self.1 {
            Encoding::Utf8 => String::from_utf8_lossy(&self.0),
            Encoding::Base64 => Cow::Owned(BASE64.encode(&self.0)),
        }
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.as_text())
    }
}

/// Only called with `Utf8` on bytes checked by [`all_utf8`].
fn encode(bytes: Vec<u8>, encoding: Encoding) -> String {
    match encoding {
        Encoding::Utf8 => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        Encoding::Base64 => BASE64.encode(bytes),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckBody {
    pub receipts: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AckResponse {
    pub results: Vec<AckResultOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AckResultOut {
    pub receipt: String,
    pub status: &'static str,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NackBody {
    pub receipt: String,
    pub retry_after_seconds: Option<u64>,
    pub error: Option<String>,
    #[serde(default)]
    pub permanent: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct StatusResponse {
    pub status: &'static str,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExtendBody {
    pub receipt: String,
    pub lease_seconds: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct ExtendResponse {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_expires_at: Option<String>,
}

impl From<ExtendResult> for ExtendResponse {
    fn from(r: ExtendResult) -> Self {
        ExtendResponse {
            status: receipt_status(r.outcome),
            lease_expires_at: r.lease_expires_at_ms.map(rfc3339_ms),
        }
    }
}

/// The JSON name of a receipt outcome.
pub(crate) fn receipt_status(outcome: ReceiptOutcome) -> &'static str {
    match outcome {
        ReceiptOutcome::Ok => "ok",
        ReceiptOutcome::Stale => "stale",
        ReceiptOutcome::Invalid => "invalid",
        ReceiptOutcome::NotOwner => "not_owner",
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct QueuesResponse {
    pub queues: Vec<QueueOut>,
}

/// A queue's settings, durations written as in the config file (`"1m"`).
#[derive(Debug, Serialize)]
pub(crate) struct QueueOut {
    name: String,
    topic: String,
    group: String,
    lease: String,
    max_lease: String,
    retry_tiers: Vec<String>,
    retry_topics: Vec<String>,
    max_attempts: u32,
    dlq_topic: String,
    ack_log_topic: String,
    dedupe_topic: String,
    ordered: bool,
    dedupe_window: String,
    gap_cap: u64,
    weight: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    push: Option<PushOut>,
}

/// A queue's push subscription; the endpoint is `url` or `grpc`.
#[derive(Debug, Serialize)]
pub(crate) struct PushOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc: Option<String>,
    concurrency: u32,
    timeout: String,
    breaker_failures: u32,
    breaker_cooldown: String,
    breaker_cooldown_max: String,
}

impl From<&PushConfig> for PushOut {
    fn from(p: &PushConfig) -> Self {
        let endpoint = p.endpoint.redacted();
        let (url, grpc) = match p.endpoint {
            PushEndpoint::Http(_) => (Some(endpoint), None),
            PushEndpoint::Grpc(_) => (None, Some(endpoint)),
        };
        PushOut {
            url,
            grpc,
            concurrency: p.concurrency,
            timeout: format_duration(p.timeout),
            breaker_failures: p.breaker_failures,
            breaker_cooldown: format_duration(p.breaker_cooldown),
            breaker_cooldown_max: format_duration(p.breaker_cooldown_max),
        }
    }
}

impl From<QueueConfig> for QueueOut {
    fn from(q: QueueConfig) -> Self {
        QueueOut {
            push: q.push.as_ref().map(PushOut::from),
            retry_topics: q.retry_topics(),
            lease: format_duration(q.lease),
            max_lease: format_duration(q.max_lease),
            retry_tiers: q.retry_tiers.iter().map(|t| format_duration(*t)).collect(),
            dedupe_window: format_duration(q.dedupe_window),
            name: q.name,
            topic: q.topic,
            group: q.group,
            max_attempts: q.max_attempts,
            dlq_topic: q.dlq_topic,
            ack_log_topic: q.ack_log_topic,
            dedupe_topic: q.dedupe_topic,
            ordered: q.ordered,
            gap_cap: q.gap_cap,
            weight: q.weight,
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct StatsResponse {
    queue: String,
    depth: i64,
    in_flight: u64,
    oldest_unacked_age_ms: i64,
    retry_depth: i64,
    dlq_depth: i64,
    dlq_oldest_age_ms: i64,
    paused: bool,
    partitions: Vec<PartitionStatsOut>,
    stuck_partitions: Vec<StuckPartitionOut>,
    /// Instances of the group signing receipts with another secret.
    foreign_secret_members: u32,
    /// What an operator must fix, in words (empty when nothing).
    warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
struct StuckPartitionOut {
    topic: String,
    partition: i32,
    offset: i64,
    error: String,
    since: String,
    errors: u64,
}

#[derive(Debug, Serialize)]
struct PartitionStatsOut {
    partition: i32,
    depth: i64,
    in_flight: u64,
    oldest_unacked_age_ms: i64,
}

impl StatsResponse {
    pub(crate) fn new(queue: String, s: QueueStats) -> Self {
        let warnings = s.warnings();
        StatsResponse {
            foreign_secret_members: s.foreign_secret_members,
            warnings,
            queue,
            depth: s.depth,
            in_flight: s.in_flight,
            oldest_unacked_age_ms: s.oldest_unacked_age_ms,
            retry_depth: s.retry_depth,
            dlq_depth: s.dlq_depth,
            dlq_oldest_age_ms: s.dlq_oldest_age_ms,
            paused: s.paused,
            partitions: s
                .partitions
                .into_iter()
                .map(PartitionStatsOut::from)
                .collect(),
            stuck_partitions: s
                .stuck_partitions
                .into_iter()
                .map(|p| StuckPartitionOut {
                    topic: p.topic,
                    partition: p.partition,
                    offset: p.offset,
                    error: p.error,
                    since: rfc3339_ms(p.since_ms),
                    errors: p.errors,
                })
                .collect(),
        }
    }
}

impl From<PartitionStats> for PartitionStatsOut {
    fn from(p: PartitionStats) -> Self {
        PartitionStatsOut {
            partition: p.partition,
            depth: p.depth,
            in_flight: p.in_flight,
            oldest_unacked_age_ms: p.oldest_unacked_age_ms,
        }
    }
}

/// The error body of every failed request.
#[derive(Debug, Serialize)]
pub(crate) struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ErrorDetail<'a> {
    pub code: &'a str,
    pub message: &'a str,
}

/// `ms` since the Unix epoch as RFC 3339 in UTC with milliseconds,
/// e.g. `2026-12-03T07:14:00.123Z`.
pub(crate) fn rfc3339_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// The inverse of [`rfc3339_ms`] for the strings it writes (what a
/// forwarded request's owner answers); `None` for anything else.
pub(crate) fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 24
        || &b[4..5] != b"-"
        || &b[7..8] != b"-"
        || &b[10..11] != b"T"
        || &b[23..] != b"Z"
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, m, s, ms) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 59 {
        return None;
    }
    // Howard Hinnant's `days_from_civil`.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400_000 + h * 3_600_000 + m * 60_000 + s * 1000 + ms)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_282_040_123), "2026-12-03T07:14:00.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        for ms in [0, 951_782_400_000, 1_796_282_040_123, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_ms(&rfc3339_ms(ms)), Some(ms), "{ms}");
        }
        assert_eq!(parse_rfc3339_ms("2026-13-03T07:14:00.123Z"), None);
        assert_eq!(parse_rfc3339_ms("2026-12-03 07:14:00.123Z"), None);
        assert_eq!(parse_rfc3339_ms("soon"), None);
        assert_eq!(rfc3339_ms(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }

    fn delivery(payload: &[u8]) -> Delivery {
        Delivery {
            message_id: "m".into(),
            receipt: "r".into(),
            key: Some(Bytes::from_static(b"k")),
            payload: Bytes::copy_from_slice(payload),
            headers: vec![("h".into(), b"v".to_vec())],
            attempt: 1,
            enqueued_at_ms: 0,
            partition: 0,
            offset: 0,
            lease_expires_at_ms: 0,
        }
    }

    #[test]
    fn deliveries_choose_base64_only_for_binary_unless_asked() {
        let json = |d, wanted| serde_json::to_value(DeliveryOut::new(d, wanted)).unwrap();
        let text = json(delivery(b"hello \"world\""), DeliveryEncoding::Auto);
        assert_eq!(text["encoding"], "utf8");
        assert_eq!(text["payload"], "hello \"world\"");
        assert_eq!(text["key"], "k");
        let binary = json(delivery(&[0xff, 0]), DeliveryEncoding::Auto);
        assert_eq!(binary["encoding"], "base64");
        assert_eq!(binary["payload"], "/wA=");
        assert_eq!(binary["key"], "aw==");
        assert_eq!(binary["headers"][0]["value"], "dg==");
        let forced = json(delivery(b"hello"), DeliveryEncoding::Base64);
        assert_eq!(forced["payload"], "aGVsbG8=");
        assert_eq!(forced["headers"][0]["value"], "dg==");
    }
}

// ---- ordered queues: parked keys and skip (issue 8) --------------------

#[derive(Debug, Serialize)]
pub(crate) struct ParkedResponse {
    pub parked: Vec<ParkedKeyOut>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ParkedKeyOut {
    partition: i32,
    /// The key when it is UTF-8, else `key_base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_base64: Option<String>,
    message_id: String,
    parked_at: String,
    held: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    released_by: Option<String>,
}

impl From<crate::service::ParkedKeyInfo> for ParkedKeyOut {
    fn from(p: crate::service::ParkedKeyInfo) -> Self {
        let (key, key_base64) = match String::from_utf8(p.key) {
            Ok(text) => (Some(text), None),
            Err(e) => (None, Some(BASE64.encode(e.as_bytes()))),
        };
        ParkedKeyOut {
            partition: p.partition,
            key,
            key_base64,
            message_id: p.message_id,
            parked_at: rfc3339_ms(p.parked_at_ms),
            held: p.held,
            released_by: p.released_by,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SkipBody {
    partition: i32,
    key: Option<String>,
    key_base64: Option<String>,
    message_id: String,
}

impl SkipBody {
    pub(crate) fn into_request(self) -> Result<crate::service::SkipRequest, ServiceError> {
        let key = match (self.key, self.key_base64) {
            (Some(k), None) => k.into_bytes(),
            (None, Some(k)) => decode("key_base64", k, Encoding::Base64)?,
            _ => {
                return Err(ServiceError::InvalidArgument(
                    "give key (UTF-8) or key_base64, not both".into(),
                ))
            }
        };
        super::edge::skip_request(self.partition, key, self.message_id)
    }
}
