//! Fetch responses encoded as parts: the encoded fields, and between them
//! each partition's record data as a value the caller supplies and sends
//! itself (file regions sent with `sendfile`, in the broker). The record
//! bytes never pass through the response buffer.
//!
//! The bytes are exactly those kafka-protocol's `FetchResponse` encoder
//! writes (a test compares the two over random responses at every version
//! we serve), including its refusals of fields a version cannot carry.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;
use std::collections::BTreeMap;

use crate::frame::SIZE_PREFIX_LEN;
use crate::header::EncodeError;

/// The Fetch versions this encoder writes.
pub const VERSIONS: std::ops::RangeInclusive<i16> = 4..=16;

/// Record data of one partition, sent by the caller.
pub trait RecordData {
    fn size_bytes(&self) -> usize;
}

impl RecordData for Bytes {
    fn size_bytes(&self) -> usize {
        self.len()
    }
}

/// One piece of an encoded response, in the order it goes on the wire.
#[derive(Debug)]
pub enum Part<R> {
    Encoded(Bytes),
    Records(R),
}

/// Encodes a complete size-prefixed Fetch response frame. Every partition's
/// `records` in `resp` must be `None`; `records` holds the record data of
/// each partition instead, in response order (topic by topic, partition by
/// partition), `None` where the wire field is null.
pub fn encode_fetch_response<R: RecordData>(
    api_version: i16,
    correlation_id: i32,
    resp: &FetchResponse,
    records: Vec<Option<R>>,
) -> Result<Vec<Part<R>>, EncodeError> {
    let error = |reason: String| EncodeError {
        api_key: ApiKey::Fetch,
        api_version,
        reason,
    };
    if !VERSIONS.contains(&api_version) {
        return Err(error("version not supported by this encoder".into()));
    }
    let partitions: usize = resp.responses.iter().map(|t| t.partitions.len()).sum();
    if records.len() != partitions {
        return Err(error(format!(
            "{} record entries for {partitions} partitions",
            records.len()
        )));
    }
    let mut w = Writer::new();
    w.buf.put_i32(0); // the size, filled in at the end
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(
            &mut w.buf,
            ApiKey::Fetch.response_header_version(api_version),
        )
        .map_err(|e| error(format!("{e:#}")))?;
    let mut records = records.into_iter();
    encode_body(&mut w, api_version, resp, &mut records).map_err(error)?;
    w.finish().map_err(error)
}

/// Collects parts; the first encoded part stays mutable until the size
/// prefix is known.
struct Writer<R> {
    done: Vec<Part<R>>,
    first: Option<BytesMut>,
    buf: BytesMut,
    len: usize,
}

impl<R: RecordData> Writer<R> {
    fn new() -> Self {
        Writer {
            done: Vec::new(),
            first: None,
            buf: BytesMut::new(),
            len: 0,
        }
    }

    fn records(&mut self, r: R) {
        self.seal();
        self.len += r.size_bytes();
        self.done.push(Part::Records(r));
    }

    fn seal(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let chunk = self.buf.split();
        self.len += chunk.len();
        if self.first.is_none() && self.done.is_empty() {
            self.first = Some(chunk);
        } else {
            self.done.push(Part::Encoded(chunk.freeze()));
        }
    }

    fn finish(mut self) -> Result<Vec<Part<R>>, String> {
        self.seal();
        let size = self.len - SIZE_PREFIX_LEN;
        let size = i32::try_from(size).map_err(|_| format!("{size} bytes do not fit a frame"))?;
        let mut first = self.first.take().expect("the size prefix was written");
        first[..SIZE_PREFIX_LEN].copy_from_slice(&size.to_be_bytes());
        let mut parts = Vec::with_capacity(self.done.len() + 1);
        parts.push(Part::Encoded(first.freeze()));
        parts.extend(self.done);
        Ok(parts)
    }
}

pub(crate) fn put_uvarint(buf: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// An array length: compact (unsigned varint of length + 1, 0 for null)
/// from v12, else an int32 (-1 for null).
pub(crate) fn put_array_len(
    buf: &mut BytesMut,
    flexible: bool,
    len: Option<usize>,
) -> Result<(), String> {
    match (flexible, len) {
        (true, None) => put_uvarint(buf, 0),
        (true, Some(n)) => {
            let n = u32::try_from(n)
                .ok()
                .and_then(|n| n.checked_add(1))
                .ok_or_else(|| format!("array of {n} elements is too long to encode"))?;
            put_uvarint(buf, n);
        }
        (false, None) => buf.put_i32(-1),
        (false, Some(n)) => {
            let n = i32::try_from(n)
                .map_err(|_| format!("array of {n} elements is too long to encode"))?;
            buf.put_i32(n);
        }
    }
    Ok(())
}

fn put_structs<T: Encodable>(
    buf: &mut BytesMut,
    version: i16,
    items: Option<&[T]>,
) -> Result<(), String> {
    put_array_len(buf, version >= 12, items.map(<[T]>::len))?;
    for item in items.unwrap_or_default() {
        item.encode(buf, version).map_err(|e| format!("{e:#}"))?;
    }
    Ok(())
}

/// A known tagged field holding one struct.
fn put_tagged_struct<T: Encodable>(
    buf: &mut BytesMut,
    version: i16,
    tag: u32,
    value: &T,
) -> Result<(), String> {
    let size = value.compute_size(version).map_err(|e| format!("{e:#}"))?;
    put_uvarint(buf, tag);
    put_uvarint(buf, tagged_size(size)?);
    value.encode(buf, version).map_err(|e| format!("{e:#}"))
}

fn tagged_size(size: usize) -> Result<u32, String> {
    u32::try_from(size).map_err(|_| format!("Tagged field is too large to encode ({size} bytes)"))
}

/// Tagged fields kafka-protocol keeps but does not know, from `first_tag` on.
fn put_unknown_tagged(
    buf: &mut BytesMut,
    first_tag: i32,
    fields: &BTreeMap<i32, Bytes>,
) -> Result<(), String> {
    for (&tag, value) in fields.range(first_tag..) {
        put_uvarint(buf, tag as u32);
        put_uvarint(buf, tagged_size(value.len())?);
        buf.put_slice(value);
    }
    Ok(())
}

fn tagged_count(unknown: usize, known: usize) -> Result<u32, String> {
    u32::try_from(unknown + known).map_err(|_| "Too many tagged fields to encode".to_string())
}

fn encode_body<R: RecordData>(
    w: &mut Writer<R>,
    version: i16,
    resp: &FetchResponse,
    records: &mut impl Iterator<Item = Option<R>>,
) -> Result<(), String> {
    w.buf.put_i32(resp.throttle_time_ms);
    if version >= 7 {
        w.buf.put_i16(resp.error_code);
        w.buf.put_i32(resp.session_id);
    } else if resp.session_id != 0 {
        return Err("A field is set that is not available on the selected protocol version".into());
    }
    put_array_len(&mut w.buf, version >= 12, Some(resp.responses.len()))?;
    for topic in &resp.responses {
        encode_topic(w, version, topic, records)?;
    }
    if version >= 12 {
        let endpoints = version >= 16 && !resp.node_endpoints.is_empty();
        put_uvarint(
            &mut w.buf,
            tagged_count(resp.unknown_tagged_fields.len(), usize::from(endpoints))?,
        );
        if endpoints {
            let mut body = BytesMut::new();
            put_structs(&mut body, version, Some(&resp.node_endpoints))?;
            put_uvarint(&mut w.buf, 0);
            put_uvarint(&mut w.buf, tagged_size(body.len())?);
            w.buf.put_slice(&body);
        }
        put_unknown_tagged(&mut w.buf, 1, &resp.unknown_tagged_fields)?;
    }
    Ok(())
}

fn encode_topic<R: RecordData>(
    w: &mut Writer<R>,
    version: i16,
    topic: &FetchableTopicResponse,
    records: &mut impl Iterator<Item = Option<R>>,
) -> Result<(), String> {
    if version <= 12 {
        let name = topic.topic.0.as_bytes();
        if version >= 12 {
            let len = u32::try_from(name.len())
                .ok()
                .and_then(|n| n.checked_add(1))
                .ok_or("topic name too long")?;
            put_uvarint(&mut w.buf, len);
        } else {
            let len = i16::try_from(name.len()).map_err(|_| "topic name too long")?;
            w.buf.put_i16(len);
        }
        w.buf.put_slice(name);
    }
    if version >= 13 {
        w.buf.put_slice(topic.topic_id.as_bytes());
    }
    put_array_len(&mut w.buf, version >= 12, Some(topic.partitions.len()))?;
    for p in &topic.partitions {
        let data = records
            .next()
            .ok_or("fewer record entries than partitions")?;
        encode_partition(w, version, p, data)?;
    }
    if version >= 12 {
        put_uvarint(
            &mut w.buf,
            tagged_count(topic.unknown_tagged_fields.len(), 0)?,
        );
        put_unknown_tagged(&mut w.buf, 0, &topic.unknown_tagged_fields)?;
    }
    Ok(())
}

fn encode_partition<R: RecordData>(
    w: &mut Writer<R>,
    version: i16,
    p: &PartitionData,
    data: Option<R>,
) -> Result<(), String> {
    if p.records.is_some() {
        return Err("partition records must be passed as parts".into());
    }
    w.buf.put_i32(p.partition_index);
    w.buf.put_i16(p.error_code);
    w.buf.put_i64(p.high_watermark);
    w.buf.put_i64(p.last_stable_offset);
    if version >= 5 {
        w.buf.put_i64(p.log_start_offset);
    }
    put_structs(&mut w.buf, version, p.aborted_transactions.as_deref())?;
    if version >= 11 {
        w.buf.put_i32(p.preferred_read_replica.0);
    } else if p.preferred_read_replica.0 != -1 {
        return Err("A field is set that is not available on the selected protocol version".into());
    }
    match data {
        None if version >= 12 => put_uvarint(&mut w.buf, 0),
        None => w.buf.put_i32(-1),
        Some(r) => {
            let len = r.size_bytes();
            if version >= 12 {
                let len = u32::try_from(len)
                    .ok()
                    .filter(|&n| n < u32::MAX)
                    .ok_or_else(|| format!("CompactBytes is too long to encode ({len} bytes)"))?;
                put_uvarint(&mut w.buf, len + 1);
            } else {
                let len = i32::try_from(len)
                    .map_err(|_| format!("Data is too long to encode ({len} bytes)"))?;
                w.buf.put_i32(len);
            }
            if len > 0 {
                w.records(r);
            }
        }
    }
    if version >= 12 {
        let diverging = p.diverging_epoch != Default::default();
        let leader = p.current_leader != Default::default();
        let snapshot = p.snapshot_id != Default::default();
        let known = usize::from(diverging) + usize::from(leader) + usize::from(snapshot);
        put_uvarint(
            &mut w.buf,
            tagged_count(p.unknown_tagged_fields.len(), known)?,
        );
        if diverging {
            put_tagged_struct(&mut w.buf, version, 0, &p.diverging_epoch)?;
        }
        if leader {
            put_tagged_struct(&mut w.buf, version, 1, &p.current_leader)?;
        }
        if snapshot {
            put_tagged_struct(&mut w.buf, version, 2, &p.snapshot_id)?;
        }
        put_unknown_tagged(&mut w.buf, 3, &p.unknown_tagged_fields)?;
    }
    Ok(())
}

/// The bytes of `parts` concatenated, with `R`'s bytes from `bytes_of`.
pub fn concat<R>(parts: &[Part<R>], bytes_of: impl Fn(&R) -> Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        match p {
            Part::Encoded(b) => out.extend_from_slice(b),
            Part::Records(r) => out.extend_from_slice(&bytes_of(r)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::encode_response;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, EpochEndOffset, LeaderIdAndEpoch, NodeEndpoint, SnapshotId,
    };
    use kafka_protocol::messages::{BrokerId, ProducerId, ResponseKind, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use proptest::prelude::*;

    /// A small deterministic generator: proptest picks the seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, one_in: u64) -> bool {
            self.below(one_in) == 0
        }
        fn i64(&mut self) -> i64 {
            match self.below(4) {
                0 => -1,
                1 => 0,
                2 => self.below(1000) as i64,
                _ => self.next() as i64,
            }
        }
        fn i32(&mut self) -> i32 {
            self.i64() as i32
        }
        fn bytes(&mut self, max: u64) -> Bytes {
            let n = self.below(max + 1) as usize;
            Bytes::from((0..n).map(|_| self.next() as u8).collect::<Vec<_>>())
        }
        fn string(&mut self, max: u64) -> StrBytes {
            let n = self.below(max + 1) as usize;
            let s: String = (0..n)
                .map(|_| (b'a' + self.below(26) as u8) as char)
                .collect();
            StrBytes::from_string(s)
        }
        fn unknown_tags(&mut self, first: i32) -> BTreeMap<i32, Bytes> {
            let mut m = BTreeMap::new();
            if self.chance(4) {
                for _ in 0..self.below(3) {
                    m.insert(first + self.below(200) as i32, self.bytes(10));
                }
            }
            m
        }
    }

    /// A random response valid at `version` (the fields kafka-protocol
    /// would refuse are left at their defaults), records inline.
    fn response(rng: &mut Rng, version: i16) -> FetchResponse {
        let flexible = version >= 12;
        let mut resp = FetchResponse::default();
        resp.throttle_time_ms = rng.i32();
        if version >= 7 {
            resp.error_code = rng.i32() as i16;
            resp.session_id = rng.i32();
        }
        for _ in 0..rng.below(4) {
            let mut t = FetchableTopicResponse::default();
            t.topic = TopicName(rng.string(30));
            t.topic_id = uuid::Uuid::from_u64_pair(rng.next(), rng.next());
            for _ in 0..rng.below(4) {
                let mut p = PartitionData::default();
                p.partition_index = rng.i32();
                p.error_code = rng.i32() as i16;
                p.high_watermark = rng.i64();
                p.last_stable_offset = rng.i64();
                p.log_start_offset = rng.i64();
                p.aborted_transactions = if rng.chance(3) {
                    None
                } else {
                    Some(
                        (0..rng.below(3))
                            .map(|_| {
                                let mut a = AbortedTransaction::default();
                                a.producer_id = ProducerId(rng.i64());
                                a.first_offset = rng.i64();
                                if flexible {
                                    a.unknown_tagged_fields = rng.unknown_tags(0);
                                }
                                a
                            })
                            .collect(),
                    )
                };
                if version >= 11 {
                    p.preferred_read_replica = BrokerId(rng.i32());
                }
                p.records = match rng.below(4) {
                    0 => None,
                    1 => Some(Bytes::new()),
                    2 => Some(rng.bytes(200)),
                    // Long enough for a multi-byte length prefix.
                    _ => Some(rng.bytes(40_000)),
                };
                if flexible {
                    if rng.chance(2) {
                        let mut d = EpochEndOffset::default();
                        d.epoch = rng.i32();
                        d.end_offset = rng.i64();
                        p.diverging_epoch = d;
                    }
                    if rng.chance(2) {
                        let mut l = LeaderIdAndEpoch::default();
                        l.leader_id = BrokerId(rng.i32());
                        l.leader_epoch = rng.i32();
                        p.current_leader = l;
                    }
                    if rng.chance(2) {
                        let mut s = SnapshotId::default();
                        s.end_offset = rng.i64();
                        s.epoch = rng.i32();
                        p.snapshot_id = s;
                    }
                    p.unknown_tagged_fields = rng.unknown_tags(3);
                }
                t.partitions.push(p);
            }
            if flexible {
                t.unknown_tagged_fields = rng.unknown_tags(0);
            }
            resp.responses.push(t);
        }
        if version >= 16 {
            for _ in 0..rng.below(3) {
                let mut e = NodeEndpoint::default();
                e.node_id = BrokerId(rng.i32());
                e.host = rng.string(20);
                e.port = rng.i32();
                e.rack = if rng.chance(2) {
                    None
                } else {
                    Some(rng.string(5))
                };
                resp.node_endpoints.push(e);
            }
        }
        if flexible {
            resp.unknown_tagged_fields = rng.unknown_tags(1);
        }
        resp
    }

    /// The response with its records moved out, as the broker builds it.
    fn split(resp: &FetchResponse) -> (FetchResponse, Vec<Option<Bytes>>) {
        let mut stripped = resp.clone();
        let mut records = Vec::new();
        for t in &mut stripped.responses {
            for p in &mut t.partitions {
                records.push(p.records.take());
            }
        }
        (stripped, records)
    }

    proptest! {
        #[test]
        fn parts_are_byte_identical_to_kafka_protocols_encoding(
            seed in 1u64..,
            version in VERSIONS,
            correlation_id in any::<i32>(),
        ) {
            let mut rng = Rng(seed);
            let full = response(&mut rng, version);
            let expected = encode_response(
                ApiKey::Fetch,
                version,
                correlation_id,
                &ResponseKind::Fetch(full.clone()),
            )
            .unwrap();
            let (stripped, records) = split(&full);
            let parts = encode_fetch_response(version, correlation_id, &stripped, records).unwrap();
            prop_assert_eq!(concat(&parts, |b: &Bytes| b.to_vec()), expected.to_vec());
            // No empty record parts, and no two encoded parts in a row.
            for pair in parts.windows(2) {
                prop_assert!(!matches!(pair, [Part::Encoded(_), Part::Encoded(_)]));
            }
            for p in &parts {
                if let Part::Records(r) = p {
                    prop_assert!(!r.is_empty());
                }
            }
        }
    }

    #[test]
    fn refuses_what_kafka_protocol_refuses() {
        let mut resp = FetchResponse::default();
        resp.session_id = 7;
        assert!(encode_response(ApiKey::Fetch, 6, 1, &ResponseKind::Fetch(resp.clone())).is_err());
        assert!(encode_fetch_response::<Bytes>(6, 1, &resp, vec![]).is_err());

        let mut resp = FetchResponse::default();
        let mut t = FetchableTopicResponse::default();
        let mut p = PartitionData::default();
        p.preferred_read_replica = BrokerId(3);
        t.partitions.push(p);
        resp.responses.push(t);
        assert!(encode_response(ApiKey::Fetch, 10, 1, &ResponseKind::Fetch(resp.clone())).is_err());
        assert!(encode_fetch_response::<Bytes>(10, 1, &resp, vec![None]).is_err());
        // Records must come as parts, one entry per partition.
        assert!(encode_fetch_response::<Bytes>(12, 1, &resp, vec![]).is_err());
        resp.responses[0].partitions[0].preferred_read_replica = BrokerId(-1);
        resp.responses[0].partitions[0].records = Some(Bytes::from_static(b"x"));
        assert!(encode_fetch_response::<Bytes>(12, 1, &resp, vec![None]).is_err());
        assert!(encode_fetch_response::<Bytes>(17, 1, &FetchResponse::default(), vec![]).is_err());
    }
}
