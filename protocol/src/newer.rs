//! Versions Kafka 4.4 serves that kafka-protocol 0.18 cannot decode or
//! encode, where each differs from the version below it only by fields at
//! a fixed place. A request of such a version is decoded as the version
//! below once its extra fields are taken out ([`split_request`]); a
//! response is encoded as the version below with its extra fields put in
//! ([`encode_newer_response`]).
//!
//! - ShareFetch v2 (KIP-1206, KIP-1222): `ShareAcquireMode` (int8) and
//!   `IsRenewAck` (bool) after `BatchSize`; the response is v1's.
//! - ShareAcknowledge v2 (KIP-1222): `IsRenewAck` (bool) after
//!   `ShareSessionEpoch`; the response gains `AcquisitionLockTimeoutMs`
//!   (int32) after `ErrorMessage`.
//! - DescribeShareGroupOffsets v1: the request is v0's; each response
//!   partition gains `Lag` (int64) after `LeaderEpoch`.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::Encodable;

use crate::fetch_response::{put_array_len, put_uvarint};
use kafka_protocol::messages::{
    ApiKey, DescribeShareGroupOffsetsResponse, RequestKind, ResponseHeader, ResponseKind,
    ShareAcknowledgeResponse,
};

/// The fields of a request version newer than kafka-protocol's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewerRequest {
    ShareFetch {
        /// 0: batch-optimized, 1: record-limit (KIP-1206).
        acquire_mode: i8,
        /// The request only renews acquisition locks (KIP-1222).
        is_renew_ack: bool,
    },
    ShareAcknowledge {
        is_renew_ack: bool,
    },
}

/// The version kafka-protocol decodes `api_key` at in place of
/// `api_version`, when that is an older one.
pub fn decoded_as(api_key: ApiKey, api_version: i16) -> Option<i16> {
    match (api_key, api_version) {
        (ApiKey::ShareFetch | ApiKey::ShareAcknowledge, 2) => Some(1),
        (ApiKey::DescribeShareGroupOffsets, 1) => Some(0),
        _ => None,
    }
}

/// The version a response of `api_key` at `api_version` is encoded at by
/// kafka-protocol when the two are the same on the wire (ShareFetch v2's
/// response is v1's); otherwise `api_version`.
pub fn response_encoded_as(api_key: ApiKey, api_version: i16) -> i16 {
    match (api_key, api_version) {
        (ApiKey::ShareFetch, 2) => 1,
        _ => api_version,
    }
}

/// Reads a compact nullable string's length prefix at `at`: the offset
/// just past the string.
fn skip_compact_string(body: &[u8], at: usize) -> Result<usize, String> {
    let mut len: u64 = 0;
    let mut i = at;
    for shift in (0..35).step_by(7) {
        let b = *body.get(i).ok_or("truncated string length")?;
        i += 1;
        len |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            // Compact: length + 1, 0 for null.
            let end = i + len.saturating_sub(1) as usize;
            return if end <= body.len() {
                Ok(end)
            } else {
                Err("string beyond the frame".into())
            };
        }
    }
    Err("string length varint too long".into())
}

/// Where the extra fields of `api_key` at `api_version` start in its body,
/// and how many bytes they take. `Ok(None)`: the version has none.
fn extra_fields_at(
    api_key: ApiKey,
    api_version: i16,
    body: &[u8],
) -> Result<Option<(usize, usize)>, String> {
    Ok(match (api_key, api_version) {
        (ApiKey::ShareFetch, 2) => {
            let at = skip_compact_string(body, 0)?; // group_id
            let at = skip_compact_string(body, at)?; // member_id
                                                     // share_session_epoch, max_wait_ms, min_bytes, max_bytes,
                                                     // max_records, batch_size.
            Some((at + 6 * 4, 2))
        }
        (ApiKey::ShareAcknowledge, 2) => {
            let at = skip_compact_string(body, 0)?;
            let at = skip_compact_string(body, at)?;
            Some((at + 4, 1)) // after share_session_epoch
        }
        _ => None,
    })
}

/// Splits a request body of a version [`decoded_as`] names into the body of
/// that older version and its extra fields. `Ok(None)`: the version needs
/// no split.
pub fn split_request(
    api_key: ApiKey,
    api_version: i16,
    body: &[u8],
) -> Result<Option<(Bytes, NewerRequest)>, String> {
    let Some((at, len)) = extra_fields_at(api_key, api_version, body)? else {
        return Ok(None);
    };
    let extra = body
        .get(at..at + len)
        .ok_or_else(|| format!("v{api_version} fields beyond the frame"))?;
    let newer = match api_key {
        ApiKey::ShareFetch => NewerRequest::ShareFetch {
            acquire_mode: extra[0] as i8,
            is_renew_ack: extra[1] != 0,
        },
        _ => NewerRequest::ShareAcknowledge {
            is_renew_ack: extra[0] != 0,
        },
    };
    let mut older = BytesMut::with_capacity(body.len() - len);
    older.put_slice(&body[..at]);
    older.put_slice(&body[at + len..]);
    Ok(Some((older.freeze(), newer)))
}

/// Appends `body` encoded at `api_version` to `out`, also at versions
/// newer than kafka-protocol's (with `newer`'s fields, or zeros): what a
/// client sends. For tests and tools; the broker only decodes requests.
pub fn encode_request_body(
    api_key: ApiKey,
    api_version: i16,
    body: &RequestKind,
    newer: Option<NewerRequest>,
    out: &mut BytesMut,
) -> anyhow::Result<()> {
    let Some(older) = decoded_as(api_key, api_version) else {
        return body.encode(out, api_version);
    };
    let mut encoded = BytesMut::new();
    body.encode(&mut encoded, older)?;
    let extra: Vec<u8> = match newer {
        Some(NewerRequest::ShareFetch {
            acquire_mode,
            is_renew_ack,
        }) => vec![acquire_mode as u8, u8::from(is_renew_ack)],
        Some(NewerRequest::ShareAcknowledge { is_renew_ack }) => vec![u8::from(is_renew_ack)],
        None => Vec::new(),
    };
    match extra_fields_at(api_key, api_version, &encoded).map_err(anyhow::Error::msg)? {
        Some((at, len)) => {
            let mut extra = extra;
            extra.resize(len, 0);
            out.put_slice(&encoded[..at]);
            out.put_slice(&extra);
            out.put_slice(&encoded[at..]);
        }
        None => out.put_slice(&encoded),
    }
    Ok(())
}

/// A response whose newest version carries fields kafka-protocol's type for
/// it lacks: the body, and those fields.
#[derive(Debug, Clone, PartialEq)]
pub enum NewerResponse {
    ShareAcknowledge {
        body: ShareAcknowledgeResponse,
        acquisition_lock_timeout_ms: i32,
    },
    DescribeShareGroupOffsets {
        body: DescribeShareGroupOffsetsResponse,
        /// Per group, topic and partition, in the body's order; -1 where
        /// it is unknown.
        lags: Vec<Vec<Vec<i64>>>,
    },
}

impl NewerResponse {
    pub fn api_key(&self) -> ApiKey {
        match self {
            NewerResponse::ShareAcknowledge { .. } => ApiKey::ShareAcknowledge,
            NewerResponse::DescribeShareGroupOffsets { .. } => ApiKey::DescribeShareGroupOffsets,
        }
    }

    /// Sets the response's throttle time (a client quota's delay).
    pub fn set_throttle_time_ms(&mut self, ms: i32) {
        match self {
            NewerResponse::ShareAcknowledge { body, .. } => body.throttle_time_ms = ms,
            NewerResponse::DescribeShareGroupOffsets { body, .. } => body.throttle_time_ms = ms,
        }
    }

    /// The body kafka-protocol encodes (at versions it knows, the whole
    /// response).
    pub fn into_body(self) -> ResponseKind {
        match self {
            NewerResponse::ShareAcknowledge { body, .. } => ResponseKind::ShareAcknowledge(body),
            NewerResponse::DescribeShareGroupOffsets { body, .. } => {
                ResponseKind::DescribeShareGroupOffsets(body)
            }
        }
    }
}

/// Encodes `response` as a complete size-prefixed frame at `api_version`.
pub fn encode_newer_response(
    api_version: i16,
    correlation_id: i32,
    response: NewerResponse,
) -> Result<Bytes, crate::EncodeError> {
    let api_key = response.api_key();
    let Some(older) = decoded_as(api_key, api_version) else {
        return crate::encode_response(api_key, api_version, correlation_id, &response.into_body());
    };
    match response {
        NewerResponse::ShareAcknowledge {
            body,
            acquisition_lock_timeout_ms,
        } => {
            let frame = crate::encode_response(
                api_key,
                older,
                correlation_id,
                &ResponseKind::ShareAcknowledge(body),
            )?;
            // size, correlation id, the header's tagged fields (none: 0),
            // throttle_time_ms, error_code, then error_message.
            let header = 4 + 4 + 1;
            let at = skip_compact_string(&frame, header + 4 + 2).map_err(|reason| {
                crate::EncodeError {
                    api_key,
                    api_version,
                    reason,
                }
            })?;
            let mut out = BytesMut::with_capacity(frame.len() + 4);
            out.put_slice(&frame[..at]);
            out.put_i32(acquisition_lock_timeout_ms);
            out.put_slice(&frame[at..]);
            let size = (out.len() - 4) as i32;
            out[..4].copy_from_slice(&size.to_be_bytes());
            Ok(out.freeze())
        }
        NewerResponse::DescribeShareGroupOffsets { body, lags } => {
            encode_describe_share_group_offsets_v1(api_version, correlation_id, &body, &lags)
        }
    }
}

/// A compact nullable string (unsigned varint of length + 1, 0 for null).
/// kafka-protocol's own encoder for it is private.
fn put_compact_string(out: &mut BytesMut, s: Option<&str>) -> Result<(), String> {
    put_array_len(out, true, s.map(str::len))?;
    out.put_slice(s.unwrap_or_default().as_bytes());
    Ok(())
}

/// DescribeShareGroupOffsets v1: v0 with each partition's lag after its
/// leader epoch (Kafka 4.4's `DescribeShareGroupOffsetsResponse.json`).
/// Each partition is kafka-protocol's v0 encoding of it with the lag put
/// in; the groups and topics around them carry no tagged fields.
fn encode_describe_share_group_offsets_v1(
    api_version: i16,
    correlation_id: i32,
    body: &DescribeShareGroupOffsetsResponse,
    lags: &[Vec<Vec<i64>>],
) -> Result<Bytes, crate::EncodeError> {
    // partition_index (int32), start_offset (int64), leader_epoch (int32).
    const LAG_AT: usize = 4 + 8 + 4;
    let write = |out: &mut BytesMut| -> Result<(), String> {
        let kp = |e: anyhow::Error| format!("{e:#}");
        out.put_i32(0); // size, filled in below
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(
                out,
                ApiKey::DescribeShareGroupOffsets.response_header_version(api_version),
            )
            .map_err(kp)?;
        out.put_i32(body.throttle_time_ms);
        put_array_len(out, true, Some(body.groups.len()))?;
        for (g, group) in body.groups.iter().enumerate() {
            put_compact_string(out, Some(group.group_id.as_str()))?;
            put_array_len(out, true, Some(group.topics.len()))?;
            for (t, topic) in group.topics.iter().enumerate() {
                put_compact_string(out, Some(topic.topic_name.as_str()))?;
                out.put_slice(topic.topic_id.as_bytes());
                put_array_len(out, true, Some(topic.partitions.len()))?;
                for (p, part) in topic.partitions.iter().enumerate() {
                    let lag = lags
                        .get(g)
                        .and_then(|topics| topics.get(t))
                        .and_then(|parts| parts.get(p))
                        .copied()
                        .unwrap_or(-1);
                    let mut v0 = BytesMut::new();
                    part.encode(&mut v0, 0).map_err(kp)?;
                    out.put_slice(&v0[..LAG_AT]);
                    out.put_i64(lag);
                    out.put_slice(&v0[LAG_AT..]);
                }
                put_uvarint(out, 0); // tagged fields
            }
            out.put_i16(group.error_code);
            put_compact_string(out, group.error_message.as_deref())?;
            put_uvarint(out, 0);
        }
        put_uvarint(out, 0);
        Ok(())
    };
    let mut out = BytesMut::with_capacity(128);
    write(&mut out).map_err(|reason| crate::EncodeError {
        api_key: ApiKey::DescribeShareGroupOffsets,
        api_version,
        reason,
    })?;
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::describe_share_group_offsets_response::*;
    use kafka_protocol::messages::share_fetch_request::FetchTopic;
    use kafka_protocol::messages::{
        GroupId, ShareAcknowledgeRequest, ShareFetchRequest, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, StrBytes};

    /// A v2 body: the v1 body with `extra` put in at `at`.
    fn with_extra(v1: &[u8], at: usize, extra: &[u8]) -> Vec<u8> {
        [&v1[..at], extra, &v1[at..]].concat()
    }

    #[test]
    fn a_share_fetch_v2_is_its_v1_body_and_the_mode_and_renew_flag() {
        let req = ShareFetchRequest::default()
            .with_group_id(Some(GroupId(StrBytes::from_static_str("g"))))
            .with_member_id(Some(StrBytes::from_static_str("member-1")))
            .with_share_session_epoch(3)
            .with_max_records(7)
            .with_batch_size(5)
            .with_topics(vec![FetchTopic::default()]);
        let mut v1 = BytesMut::new();
        req.encode(&mut v1, 1).unwrap();
        // group (1 + 1), member (1 + 8), six int32s.
        let v2 = with_extra(&v1, 2 + 9 + 24, &[1, 1]);
        let (older, newer) = split_request(ApiKey::ShareFetch, 2, &v2).unwrap().unwrap();
        assert_eq!(older.as_ref(), v1.as_ref());
        assert_eq!(
            newer,
            NewerRequest::ShareFetch {
                acquire_mode: 1,
                is_renew_ack: true
            }
        );
        assert_eq!(
            ShareFetchRequest::decode(&mut older.clone(), 1).unwrap(),
            req
        );
    }

    #[test]
    fn a_share_acknowledge_v2_with_a_null_group_splits_after_the_epoch() {
        let req = ShareAcknowledgeRequest::default().with_share_session_epoch(9);
        let mut v1 = BytesMut::new();
        req.encode(&mut v1, 1).unwrap();
        let v2 = with_extra(&v1, 1 + 1 + 4, &[0]);
        let (older, newer) = split_request(ApiKey::ShareAcknowledge, 2, &v2)
            .unwrap()
            .unwrap();
        assert_eq!(older.as_ref(), v1.as_ref());
        assert_eq!(
            newer,
            NewerRequest::ShareAcknowledge {
                is_renew_ack: false
            }
        );
    }

    #[test]
    fn a_truncated_v2_body_is_an_error_not_a_panic() {
        for body in [
            &[][..],
            &[0x05, b'a'][..],
            &[0, 0, 0, 0, 0][..],
            &[0xff; 6][..],
        ] {
            assert!(split_request(ApiKey::ShareFetch, 2, body).is_err());
            assert!(split_request(ApiKey::ShareAcknowledge, 2, body).is_err());
        }
        assert_eq!(split_request(ApiKey::ShareFetch, 1, &[]), Ok(None));
    }

    #[test]
    fn a_share_acknowledge_v2_response_carries_the_lock_timeout_after_the_error() {
        let body = ShareAcknowledgeResponse::default()
            .with_error_code(0)
            .with_error_message(Some(StrBytes::from_static_str("hm")));
        let v1 = crate::encode_response(
            ApiKey::ShareAcknowledge,
            1,
            42,
            &ResponseKind::ShareAcknowledge(body.clone()),
        )
        .unwrap();
        let v2 = encode_newer_response(
            2,
            42,
            NewerResponse::ShareAcknowledge {
                body,
                acquisition_lock_timeout_ms: 30_000,
            },
        )
        .unwrap();
        // size 4, correlation 4, header tags 1, throttle 4, error 2, "hm" 3.
        let at = 4 + 4 + 1 + 4 + 2 + 3;
        assert_eq!(&v2[4..at], &v1[4..at]);
        assert_eq!(&v2[at..at + 4], &30_000i32.to_be_bytes());
        assert_eq!(&v2[at + 4..], &v1[at..]);
        assert_eq!(
            i32::from_be_bytes(v2[..4].try_into().unwrap()) as usize,
            v2.len() - 4
        );
    }

    #[test]
    fn describe_share_group_offsets_v1_is_v0_with_each_partitions_lag() {
        let body = DescribeShareGroupOffsetsResponse::default().with_groups(vec![
            DescribeShareGroupOffsetsResponseGroup::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g")))
                .with_topics(vec![DescribeShareGroupOffsetsResponseTopic::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(vec![
                        DescribeShareGroupOffsetsResponsePartition::default()
                            .with_partition_index(0)
                            .with_start_offset(5)
                            .with_leader_epoch(2),
                        DescribeShareGroupOffsetsResponsePartition::default()
                            .with_partition_index(1)
                            .with_start_offset(-1),
                    ])]),
        ]);
        let v0 = crate::encode_response(
            ApiKey::DescribeShareGroupOffsets,
            0,
            7,
            &ResponseKind::DescribeShareGroupOffsets(body.clone()),
        )
        .unwrap();
        let v1 = encode_newer_response(
            1,
            7,
            NewerResponse::DescribeShareGroupOffsets {
                body,
                lags: vec![vec![vec![12]]],
            },
        )
        .unwrap();
        // v1 is v0 with 8 bytes per partition: 12, then -1 (not given).
        assert_eq!(v1.len(), v0.len() + 16);
        let first = v1
            .windows(8)
            .position(|w| w == 12i64.to_be_bytes())
            .unwrap();
        // partition 0, start 5, epoch 2, then the lag.
        assert_eq!(&v1[first - 16..first - 12], &0i32.to_be_bytes());
        assert_eq!(&v1[first - 12..first - 4], &5i64.to_be_bytes());
        let without: Vec<u8> = [
            &v1[4..first],
            &v1[first + 8..first + 8 + 2 + 1 + 1 + 4 + 8 + 4],
            &v1[first + 8 + 2 + 1 + 1 + 4 + 8 + 4 + 8..],
        ]
        .concat();
        assert_eq!(
            &v1[first + 8 + 2 + 1 + 1 + 4 + 8 + 4..][..8],
            &(-1i64).to_be_bytes()
        );
        assert_eq!(without.as_slice(), &v0[4..]);
    }
}
