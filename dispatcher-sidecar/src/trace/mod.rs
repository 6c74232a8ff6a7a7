//! Tracing a message (issue 8): where a message is and where it has been,
//! found by its message id without scanning the queue's topic.
//!
//! The **index** is a compacted topic per queue, `<topic>.index` (created
//! with the primary's partition count, read back at start), keyed by
//! message id, partitioned by a stable hash of the id ([`index_partition`]).
//! Its value ([`IndexEntry`]) names where the message was first produced
//! (origin) and where it is now (its latest location: the primary, a retry
//! tier, the DLQ, a redriven copy). It is written where the dispatcher
//! already writes once per message on a cold path: an API produce, and each
//! failure copy to a retry tier or the DLQ. Receives and acks write nothing
//! (the hot path). A message produced straight to the topic by a plain
//! Kafka client has the derived id `<topic>-<partition>-<offset>` and no
//! entry until it fails: its location is read from the id.
//!
//! The **history** travels with the message: the envelope of a copy carries
//! every failure (attempt, time, error, consumer) and, in the
//! `dispatcher.path` header ([`PATH_HEADER`]), every earlier location. A
//! lookup reads one index partition (newest first, stopping at the first
//! match) and the one record at the latest location; the owner of that
//! location's partition adds what its lease engine knows (in flight, acked
//! above the commit point, waiting for its due time).
//!
//! This module is pure (no I/O): the entry and path codecs and the assembly
//! of the ordered events. `index` reads the index topic; the queue runtime
//! (`queue::runtime::trace`) writes it and answers the live state; `cli` is
//! `dispatcher trace`.
//!
//! Invariant: nothing here is written per lease or per ack.

pub mod cli;
pub mod index;

use serde::{Deserialize, Serialize};

use crate::lease::RetryEnvelope;

/// The header of a retry or DLQ copy listing the message's earlier
/// locations (JSON array of [`Location`], oldest first).
pub const PATH_HEADER: &str = "dispatcher.path";
/// A path keeps at most this many locations (the newest), like the failure
/// history of the envelope.
pub const MAX_PATH: usize = 32;
/// An index value longer than this is not read (damage, or not ours).
const MAX_ENTRY_BYTES: usize = 8 * 1024;

/// The index topic of a queue whose primary topic is `topic`.
pub fn index_topic(topic: &str) -> String {
    format!("{topic}.index")
}

/// The index partition of a message id: FNV-1a (32 bit) of its bytes, so
/// every instance and version agrees without asking librdkafka's
/// partitioner.
pub fn index_partition(message_id: &str, partitions: i32) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in message_id.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % partitions.max(1) as u32) as i32
}

/// Checks a message id given to a lookup: what a produce would accept
/// (1 to 256 bytes), without control characters.
pub fn validate_message_id(id: &str) -> Result<(), String> {
    let max = crate::queue::message::MAX_MESSAGE_ID_BYTES;
    if id.is_empty() || id.len() > max {
        return Err(format!("a message id has 1 to {max} bytes"));
    }
    if id.chars().any(char::is_control) {
        return Err("a message id has no control characters".into());
    }
    Ok(())
}

/// The (topic, partition, offset) of a derived id `<topic>-<partition>-<offset>`
/// (`queue::message::derived_message_id`); `None` when `id` is not one.
pub fn parse_derived_id(id: &str) -> Option<(&str, i32, i64)> {
    let (rest, offset) = id.rsplit_once('-')?;
    let (topic, partition) = rest.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if topic.is_empty() || !digits(partition) || !digits(offset) {
        return None;
    }
    Some((topic, partition.parse().ok()?, offset.parse().ok()?))
}

/// What kind of place a location is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocationKind {
    /// The queue's topic, where the message was produced.
    Primary,
    /// A retry tier's topic.
    Retry,
    Dlq,
    /// The queue's topic again, written by a redrive of the DLQ.
    Redriven,
    /// An ordered queue's hold area for a parked key.
    Held,
}

/// One record of the message: where, and when it was written there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub kind: LocationKind,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub at_ms: i64,
}

impl Location {
    fn same_record(&self, other: &Location) -> bool {
        self.topic == other.topic
            && self.partition == other.partition
            && self.offset == other.offset
    }
}

/// The index topic's value for one message id (JSON, readable with any
/// Kafka tool).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Where it was first produced; `None` for a message produced with a
    /// delay (it went straight to a retry tier).
    pub origin: Option<Location>,
    /// Where it is now.
    pub location: Location,
}

impl IndexEntry {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain data serializes")
    }

    pub fn decode(value: &[u8]) -> Option<IndexEntry> {
        if value.len() > MAX_ENTRY_BYTES {
            return None;
        }
        serde_json::from_slice(value).ok()
    }

    /// The entry of a message whose envelope is `envelope`, now at
    /// `location` (a failure copy, or a redriven copy).
    pub fn from_envelope(envelope: &RetryEnvelope, location: Location) -> IndexEntry {
        let origin = (envelope.origin_offset >= 0).then(|| Location {
            kind: LocationKind::Primary,
            topic: envelope.origin_topic.clone(),
            partition: envelope.origin_partition,
            offset: envelope.origin_offset,
            at_ms: envelope.first_enqueued_ms,
        });
        IndexEntry { origin, location }
    }
}

/// The earlier locations a record's [`PATH_HEADER`] lists (empty when it
/// has none or it is damaged).
pub fn path_of(headers: &[(String, Vec<u8>)]) -> Vec<Location> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| k == PATH_HEADER)
        .and_then(|(_, v)| serde_json::from_slice::<Vec<Location>>(v).ok())
        .unwrap_or_default()
}

/// The [`PATH_HEADER`] for a copy made of a record with `headers` that is
/// at `here`: its path plus `here`, the newest [`MAX_PATH`] kept. Add it
/// after the envelope is written (`RetryEnvelope::write_into` drops every
/// `dispatcher.*` header).
pub fn path_header(headers: &[(String, Vec<u8>)], here: Location) -> (String, Vec<u8>) {
    let mut path = path_of(headers);
    path.push(here);
    if path.len() > MAX_PATH {
        path.drain(..path.len() - MAX_PATH);
    }
    (
        PATH_HEADER.to_owned(),
        serde_json::to_vec(&path).expect("plain data serializes"),
    )
}

/// One step of a message's path, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    #[serde(with = "rfc3339")]
    pub at: i64,
    pub event: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Written to the queue's topic (or, with a delay, to a retry tier).
    Produced,
    /// A delivery that failed: nacked, its lease expired, or forced out by
    /// the gap cap.
    DeliveryFailed,
    /// Copied to a retry tier.
    Retried,
    DeadLettered,
    Redriven,
    Held,
    /// Moved to the queue's topic otherwise.
    Moved,
}

/// Where the message is now and in what state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrentState {
    pub status: Status,
    pub location: Place,
    /// One sentence for a person.
    pub detail: String,
    /// What the answer rests on.
    pub source: Source,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub lease_expires_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub due_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub committed_offset: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_start_offset: Option<i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub kind: LocationKind,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl From<&Location> for Place {
    fn from(l: &Location) -> Self {
        Place {
            kind: l.kind,
            topic: l.topic.clone(),
            partition: l.partition,
            offset: l.offset,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting to be delivered.
    Queued,
    /// On a retry tier, not due yet.
    Waiting,
    InFlight,
    /// Failed; its copy to a retry tier or the DLQ is being written.
    PendingRoute,
    Acked,
    DeadLettered,
    Held,
    /// The record left the topic's retention before it was acked.
    LeftRetention,
    /// Nobody could say (the partition's owner was not reached and the
    /// group has not committed past it).
    NotAcked,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The lease engine of the instance that owns the partition.
    Owner,
    /// The group's committed offset.
    Commit,
    /// The log alone (the DLQ, a hold area, the log start).
    Log,
}

/// A message's trace in one queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageTrace {
    pub queue: String,
    pub message_id: String,
    pub events: Vec<TraceEvent>,
    pub state: CurrentState,
}

/// The answer of `GET /messages/{message_id}` (openapi.yaml).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceResponse {
    pub message_id: String,
    /// One per queue that knows the message (usually one).
    pub traces: Vec<MessageTrace>,
}

/// What a lookup found, before the state is known.
#[derive(Clone, Debug, Default)]
pub struct Found {
    pub origin: Option<Location>,
    /// The envelope of the record at the latest location, when read.
    pub envelope: Option<RetryEnvelope>,
    /// That record's path header.
    pub path: Vec<Location>,
}

fn event(at: i64, kind: EventKind) -> TraceEvent {
    TraceEvent {
        at,
        event: kind,
        topic: None,
        partition: None,
        offset: None,
        attempt: None,
        consumer: None,
        error: None,
    }
}

fn at_place(mut e: TraceEvent, l: &Location) -> TraceEvent {
    e.topic = Some(l.topic.clone());
    e.partition = Some(l.partition);
    e.offset = Some(l.offset);
    e
}

/// The ordered events of a message: produced, then each failed delivery
/// and each copy, by time (a failure comes before the copy it caused).
pub fn events(found: &Found, location: &Location) -> Vec<TraceEvent> {
    let origin = found
        .origin
        .clone()
        .or_else(|| found.path.first().cloned())
        .unwrap_or_else(|| location.clone());
    let produced_at = found
        .envelope
        .as_ref()
        .map_or(origin.at_ms, |e| e.first_enqueued_ms);
    let mut out = vec![at_place(event(produced_at, EventKind::Produced), &origin)];
    if let Some(env) = &found.envelope {
        for f in &env.errors {
            let mut e = event(f.at_ms, EventKind::DeliveryFailed);
            e.attempt = Some(f.attempt);
            e.consumer = f.consumer.clone();
            e.error = Some(f.error.clone());
            out.push(e);
        }
    }
    let mut seen: Vec<&Location> = vec![&origin];
    for l in found.path.iter().chain(std::iter::once(location)) {
        if seen.iter().any(|s| s.same_record(l)) {
            continue;
        }
        seen.push(l);
        let kind = match l.kind {
            LocationKind::Primary => EventKind::Moved,
            LocationKind::Retry => EventKind::Retried,
            LocationKind::Dlq => EventKind::DeadLettered,
            LocationKind::Redriven => EventKind::Redriven,
            LocationKind::Held => EventKind::Held,
        };
        out.push(at_place(event(l.at_ms, kind), l));
    }
    // Stable: at equal times the failure stays before its copy.
    out[1..].sort_by_key(|e| e.at);
    out
}

mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ms: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::api::json::rfc3339_ms(*ms))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let text = String::deserialize(d)?;
        crate::api::json::parse_rfc3339_ms(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text:?}")))
    }
}

mod rfc3339_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ms: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match ms {
            Some(ms) => super::rfc3339::serialize(ms, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| {
            crate::api::json::parse_rfc3339_ms(&t)
                .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {t:?}")))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Attempt;

    fn loc(kind: LocationKind, topic: &str, offset: i64, at_ms: i64) -> Location {
        Location {
            kind,
            topic: topic.into(),
            partition: 1,
            offset,
            at_ms,
        }
    }

    #[test]
    fn ids_hash_stably_and_derived_ids_parse() {
        // Fixed values: a change would strand every index written before.
        assert_eq!(index_partition("", 8), (0x811c_9dc5u32 % 8) as i32);
        assert_eq!(index_partition("a", 8), (0xe40c_292cu32 % 8) as i32);
        assert!((0..1000).all(|i| (0..8).contains(&index_partition(&i.to_string(), 8))));
        assert_eq!(parse_derived_id("jobs-2-7"), Some(("jobs", 2, 7)));
        assert_eq!(parse_derived_id("my-jobs-0-12"), Some(("my-jobs", 0, 12)));
        assert_eq!(parse_derived_id("jobs-x-7"), None);
        assert_eq!(parse_derived_id("-2-7"), None);
        assert_eq!(parse_derived_id("jobs-2-"), None);
        assert_eq!(parse_derived_id("0b7f-uuid"), None);
        assert!(validate_message_id("m-1").is_ok());
        assert!(validate_message_id("").is_err());
        assert!(validate_message_id(&"x".repeat(257)).is_err());
        assert!(validate_message_id("a\nb").is_err());
    }

    #[test]
    fn entries_and_paths_round_trip_and_are_bounded() {
        let e = IndexEntry {
            origin: Some(loc(LocationKind::Primary, "jobs", 7, 1_000)),
            location: loc(LocationKind::Dlq, "jobs.dlq", 0, 5_000),
        };
        assert_eq!(IndexEntry::decode(&e.encode()), Some(e));
        assert_eq!(IndexEntry::decode(b"{"), None);
        assert_eq!(IndexEntry::decode(&vec![b' '; MAX_ENTRY_BYTES + 1]), None);
        let mut headers = vec![("user".to_owned(), b"x".to_vec())];
        for i in 0..40 {
            let h = path_header(&headers, loc(LocationKind::Retry, "t", i, i));
            headers.retain(|(k, _)| k != PATH_HEADER);
            headers.push(h);
        }
        let path = path_of(&headers);
        assert_eq!(path.len(), MAX_PATH);
        assert_eq!(path.last().unwrap().offset, 39);
        assert!(path_of(&[(PATH_HEADER.into(), b"nope".to_vec())]).is_empty());
    }

    #[test]
    fn events_follow_the_path_in_time_order() {
        let origin = loc(LocationKind::Primary, "jobs", 7, 1_000);
        let tier1 = loc(LocationKind::Retry, "jobs.retry.1s", 0, 2_001);
        let tier2 = loc(LocationKind::Retry, "jobs.retry.2s", 0, 4_001);
        let dlq = loc(LocationKind::Dlq, "jobs.dlq", 0, 7_000);
        let mut env = RetryEnvelope {
            origin_topic: "jobs".into(),
            origin_partition: 1,
            origin_offset: 7,
            message_id: "m".into(),
            attempt: Attempt(3),
            first_enqueued_ms: 1_000,
            due_ms: None,
            errors: vec![],
        };
        env.push_failure(Attempt(1), 2_000, "one", Some("w1"));
        env.push_failure(Attempt(2), 4_000, "two", Some("w2"));
        env.push_failure(Attempt(3), 7_000, "three", None);
        let found = Found {
            origin: Some(origin.clone()),
            envelope: Some(env),
            path: vec![origin, tier1, tier2],
        };
        let kinds: Vec<(EventKind, i64)> = events(&found, &dlq)
            .iter()
            .map(|e| (e.event, e.at))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::Produced, 1_000),
                (EventKind::DeliveryFailed, 2_000),
                (EventKind::Retried, 2_001),
                (EventKind::DeliveryFailed, 4_000),
                (EventKind::Retried, 4_001),
                (EventKind::DeliveryFailed, 7_000),
                (EventKind::DeadLettered, 7_000),
            ]
        );
        let json = serde_json::to_string(&events(&found, &dlq)).unwrap();
        let back: Vec<TraceEvent> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, events(&found, &dlq));
        // The answer an owner sends a forwarding instance reads back whole.
        let state = CurrentState {
            status: Status::InFlight,
            location: Place::from(&dlq),
            detail: "d".into(),
            source: Source::Owner,
            consumer: Some("w".into()),
            attempt: Some(2),
            lease_expires_at: Some(1_796_282_040_123),
            due_at: None,
            committed_offset: Some(3),
            log_start_offset: Some(0),
        };
        let answer = TraceResponse {
            message_id: "m".into(),
            traces: vec![MessageTrace {
                queue: "q".into(),
                message_id: "m".into(),
                events: events(&found, &dlq),
                state,
            }],
        };
        let json = serde_json::to_value(&answer).unwrap();
        assert_eq!(
            json["traces"][0]["state"]["lease_expires_at"],
            "2026-12-03T07:14:00.123Z"
        );
        assert!(json["traces"][0]["state"].get("due_at").is_none());
        assert_eq!(json["traces"][0]["state"]["status"], "in_flight");
        assert_eq!(
            serde_json::from_value::<TraceResponse>(json).unwrap(),
            answer
        );
        // A message never moved: produced only.
        let only = loc(LocationKind::Primary, "jobs", 3, 9);
        let plain = Found::default();
        assert_eq!(events(&plain, &only).len(), 1);
    }
}
