//! Fuzz targets over what the dispatcher reads from clients and from Kafka
//! topics that any Kafka client can write to (its ack log, retry tiers,
//! DLQ, control, dedupe and index topics): each function takes arbitrary
//! bytes and panics when a property that must hold for every input fails.
//! The libFuzzer binaries in `dispatcher-sidecar/fuzz` are one line each
//! around these, and `tests/fuzz_corpus.rs` replays the committed corpus
//! through them on every `cargo test`. Not part of the crate's API.

use std::time::{Duration, UNIX_EPOCH};

use crate::lease::{
    decode_record, encode_record, Attempt, ConsumerSlot, Generation, LeaseConfig, LeaseEvent,
    LeasedRun, PartitionLeases, QueuePartition, Receipt, ReceiptCodec, ReceiptError, RetryEnvelope,
    LEASE_BATCH_RING,
};

const SECRET: [u8; 32] = [7; 32];

/// Reads fields off the front of a fuzz input; short reads give zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        let b = self.take(2);
        if b.len() == 2 {
            u16::from_be_bytes([b[0], b[1]])
        } else {
            0
        }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// `data`'s first byte picks a mode. Mode 0: the rest, as text, is a
/// receipt a client sent; whatever it is, decoding answers, and a receipt
/// that verifies re-encodes to one naming the same delivery. Mode 1: a
/// receipt is issued for the delivery the next 18 bytes name, one of its
/// characters is replaced, and the result must never verify as another
/// delivery (a forged receipt is `Forged` or `Malformed`).
pub fn receipt(data: &[u8]) {
    let codec = ReceiptCodec::new(&SECRET, "orders");
    let mut input = Input(data);
    match input.u8() % 2 {
        0 => {
            let Ok(text) = std::str::from_utf8(input.0) else {
                return;
            };
            if let Ok(r) = codec.decode(text) {
                assert_eq!(codec.decode(&codec.encode(&r)), Ok(r));
            }
        }
        _ => {
            let f = input.take(18);
            if f.len() < 18 {
                return;
            }
            let issued = Receipt {
                partition: QueuePartition {
                    topic: u16::from_be_bytes([f[0], f[1]]),
                    partition: i32::from_be_bytes(f[2..6].try_into().expect("4")),
                },
                offset: i64::from_be_bytes(f[6..14].try_into().expect("8")),
                generation: Generation(u32::from_be_bytes(f[14..18].try_into().expect("4"))),
            };
            let text = codec.encode(&issued);
            assert_eq!(codec.decode(&text), Ok(issued));
            let mut bytes = text.into_bytes();
            let at = usize::from(input.u8()) % bytes.len();
            let with = input.u8();
            if bytes[at] == with || !with.is_ascii() {
                return;
            }
            bytes[at] = with;
            let tampered = String::from_utf8(bytes).expect("ascii");
            match codec.decode(&tampered) {
                Err(ReceiptError::Forged | ReceiptError::Malformed) => {}
                Ok(r) => assert_eq!(r, issued, "a tampered receipt verified as {r:?}"),
            }
            // Another queue's codec never accepts it.
            let other = ReceiptCodec::new(&SECRET, "payments");
            assert!(
                other.decode(&tampered).is_err() && other.decode(&codec.encode(&issued)).is_err()
            );
        }
    }
}

/// Header names the envelope reads, so inputs reach its fields.
const ENVELOPE_HEADERS: [&str; 9] = [
    "dispatcher.origin-topic",
    "dispatcher.origin-partition",
    "dispatcher.origin-offset",
    "dispatcher.message-id",
    "dispatcher.attempt",
    "dispatcher.first-enqueued-ms",
    "dispatcher.due-ms",
    "dispatcher.errors",
    "dispatcher.path",
];

/// `data` is a record's headers, each `[name][value length: u16][value]`
/// where a name byte below 9 stands for a `dispatcher.*` header and any
/// other is followed by that many bytes of name. An envelope that reads
/// writes back to headers that read as the same envelope; appending a
/// failure keeps at most the newest 32.
pub fn envelope(data: &[u8]) {
    let mut input = Input(data);
    let mut headers = Vec::new();
    while !input.0.is_empty() {
        let n = input.u8();
        let name = match ENVELOPE_HEADERS.get(usize::from(n)) {
            Some(name) => (*name).to_owned(),
            None => String::from_utf8_lossy(input.take(usize::from(n - 9))).into_owned(),
        };
        let len = usize::from(input.u16());
        headers.push((name, input.take(len).to_vec()));
    }
    let Ok(Some(mut envelope)) = RetryEnvelope::from_headers(&headers) else {
        return;
    };
    let mut written = headers.clone();
    envelope.write_into(&mut written);
    assert_eq!(
        RetryEnvelope::from_headers(&written).as_ref(),
        Ok(&Some(envelope.clone())),
        "envelope did not round-trip"
    );
    envelope.push_failure(Attempt(envelope.attempt.0), 1, &"e".repeat(5000), Some("c"));
    // The envelope keeps its newest 32 failures.
    assert!(envelope.errors.len() <= 32);
    assert_eq!(
        RetryEnvelope::from_headers(&envelope.to_headers()),
        Ok(Some(envelope)),
        "envelope with a new failure did not round-trip"
    );
}

/// `data` is `[group committed offset: u16]` then ack-log records, each
/// `[key length: u8][key][value length: u16][value]`, as a new owner reads
/// its partition's ack log. A record that decodes re-encodes to one that
/// decodes the same; the decoded events rebuild the partition's leases,
/// whose commit point never goes below the group's.
pub fn ack_log(data: &[u8]) {
    let mut input = Input(data);
    let committed = i64::from(input.u16());
    let mut events = Vec::new();
    while !input.0.is_empty() {
        let key_len = usize::from(input.u8());
        let key = input.take(key_len);
        let value_len = usize::from(input.u16());
        let value = input.take(value_len);
        if let Ok((partition, event)) = decode_record(key, value) {
            let ring = match &event {
                LeaseEvent::LeasedBatch { ring, .. } => *ring,
                _ => key
                    .get(8..12)
                    .map_or(1, |r| u32::from_be_bytes(r.try_into().expect("4"))),
            };
            let again = encode_record(partition, ring, &event);
            assert_eq!(
                decode_record(&again.key, &again.value),
                Ok((partition, event.clone())),
                "ack-log record did not round-trip"
            );
            events.push(event);
        }
        let _ = crate::queue::ordered::decode(key, value);
        let _ = crate::queue::ordered::decode_tombstone(key);
    }
    let config = LeaseConfig::default();
    let partition = QueuePartition {
        topic: 0,
        partition: 0,
    };
    let rebuilt = PartitionLeases::rebuild(partition, config, committed, events)
        .expect("default config is valid");
    assert!(rebuilt.leases.committed_offset() >= committed);
}

/// `data`'s first byte picks one of the dispatcher's other readers of
/// bytes from Kafka or from clients, which gets the rest: the trace index
/// entry, the dedupe value, the pause record, the redrive bitmap, a group
/// member's assignment, a time filter, a derived message id, a
/// Retry-After, a duration. Each answers; the ones with writers round-trip.
pub fn values(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = std::str::from_utf8(rest).ok();
    match pick % 9 {
        0 => {
            if let Some(e) = crate::trace::IndexEntry::decode(rest) {
                assert_eq!(crate::trace::IndexEntry::decode(&e.encode()), Some(e));
            }
        }
        1 => {
            if let Some((p, o)) = crate::kafka::dedupe_log::decode_value(rest) {
                let v = crate::kafka::dedupe_log::encode_value(p, o);
                assert_eq!(crate::kafka::dedupe_log::decode_value(&v), Some((p, o)));
            }
        }
        2 => {
            let _ = crate::kafka::control::decode_pause(Some(rest));
        }
        3 => {
            if let Some(bits) = crate::redrive::ChunkBits::decode(rest) {
                assert_eq!(bits.encode(), rest, "redrive bitmap did not round-trip");
            }
        }
        4 => {
            let _ = crate::forward::parse_assignment(rest);
        }
        5 => {
            let _ = text.map(crate::redrive::parse_time);
        }
        6 => {
            let _ = text.map(crate::trace::parse_derived_id);
        }
        7 => {
            let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
            let _ = text.map(|t| crate::push::parse_retry_after(t, now));
        }
        _ => {
            let _ = text.map(crate::config::parse_duration);
        }
    }
}

/// A fuzz target: arbitrary bytes in, a panic when a property fails.
type Target = fn(&[u8]);

/// The fuzz targets of this crate by name, as `dispatcher-sidecar/fuzz`
/// names its binaries and corpus directories.
pub const TARGETS: &[(&str, Target)] = &[
    ("receipt", receipt),
    ("envelope", envelope),
    ("ack_log", ack_log),
    ("values", values),
];

/// Seeds for the targets, built by the dispatcher's own writers.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let codec = ReceiptCodec::new(&SECRET, "orders");
    let r = Receipt {
        partition: QueuePartition {
            topic: 1,
            partition: 3,
        },
        offset: 981,
        generation: Generation(4),
    };
    let mut text = vec![0u8];
    text.extend_from_slice(codec.encode(&r).as_bytes());
    out.push(("receipt", text));
    let mut forged = vec![1u8, 0, 1, 0, 0, 0, 3];
    forged.extend_from_slice(&981i64.to_be_bytes());
    forged.extend_from_slice(&[0, 0, 0, 4, 20, b'A']);
    out.push(("receipt", forged));

    let mut envelope = RetryEnvelope {
        origin_topic: "orders".into(),
        origin_partition: 2,
        origin_offset: 981,
        message_id: "m-1".into(),
        attempt: Attempt(2),
        first_enqueued_ms: 1_700_000_000_000,
        due_ms: Some(1_700_000_010_000),
        errors: Vec::new(),
    };
    envelope.push_failure(Attempt(1), 1_700_000_000_500, "lease expired", Some("w-1"));
    let mut headers = Vec::new();
    for (name, value) in envelope.to_headers() {
        match ENVELOPE_HEADERS.iter().position(|n| *n == name) {
            Some(i) => headers.push(i as u8),
            None => {
                headers.push(9 + name.len() as u8);
                headers.extend_from_slice(name.as_bytes());
            }
        }
        headers.extend_from_slice(&(value.len() as u16).to_be_bytes());
        headers.extend_from_slice(&value);
    }
    out.push(("envelope", headers));

    let p = QueuePartition {
        topic: 0,
        partition: 0,
    };
    let events = [
        LeaseEvent::CommitAdvanced {
            offset: 10,
            generation: Generation(3),
        },
        LeaseEvent::Leased {
            offset: 12,
            generation: Generation(3),
            expiry_ms: 1_700_000_060_000,
            consumer: ConsumerSlot(1),
            attempt: Attempt(1),
        },
        LeaseEvent::Acked { offset: 11 },
        LeaseEvent::AckedRun { start: 13, end: 16 },
        LeaseEvent::LeasedBatch {
            ring: LEASE_BATCH_RING,
            slot: 1,
            generation: Generation(3),
            runs: vec![LeasedRun {
                start: 16,
                len: 4,
                expiry_ms: 1_700_000_060_000,
                consumer: ConsumerSlot(2),
                attempt: Attempt(1),
            }],
        },
    ];
    let mut log = 10u16.to_be_bytes().to_vec();
    for event in &events {
        let rec = encode_record(p, 1024, event);
        log.push(rec.key.len() as u8);
        log.extend_from_slice(&rec.key);
        log.extend_from_slice(&(rec.value.len() as u16).to_be_bytes());
        log.extend_from_slice(&rec.value);
    }
    out.push(("ack_log", log));

    let entry_pick = |pick: u8, bytes: &[u8]| {
        let mut v = vec![pick];
        v.extend_from_slice(bytes);
        v
    };
    out.push((
        "values",
        entry_pick(1, &crate::kafka::dedupe_log::encode_value(3, 99)),
    ));
    out.push(("values", entry_pick(2, br#"{"paused":true,"at_ms":1}"#)));
    out.push((
        "values",
        entry_pick(4, &[0, 1, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0]),
    ));
    out.push(("values", entry_pick(5, b"2024-01-02T03:04:05Z")));
    out.push(("values", entry_pick(6, b"orders-3-981")));
    out.push(("values", entry_pick(7, b"Wed, 21 Oct 2015 07:28:00 GMT")));
    out.push(("values", entry_pick(8, b"1m30s")));
    out
}
