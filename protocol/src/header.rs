//! Request decoding and response encoding around kafka-protocol's messages.
//!
//! [`decode_request`] takes one frame body, reads the fixed header prefix
//! (api key, api version, correlation id) itself so it can answer even when
//! the body's version is unknown, checks the version against
//! [`crate::versions`], runs the [`crate::guard`] and only then hands the bytes
//! to kafka-protocol.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use thiserror::Error;

use crate::frame::SIZE_PREFIX_LEN;
use crate::guard::{self, GuardError};
use crate::newer::{self, NewerRequest};
use crate::versions;

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub header: RequestHeader,
    /// At a version newer than kafka-protocol's, the version below it.
    pub body: RequestKind,
    /// The fields of a version newer than kafka-protocol's
    /// ([`crate::newer`]).
    pub newer: Option<NewerRequest>,
}

impl Request {
    pub fn api_key(&self) -> i16 {
        self.header.request_api_key
    }
    pub fn api_version(&self) -> i16 {
        self.header.request_api_version
    }
    pub fn correlation_id(&self) -> i32 {
        self.header.correlation_id
    }
}

/// Why a frame is not a request the broker handles. The comment on each
/// variant says what Kafka does about it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// Shorter than api key + api version + correlation id: close the connection.
    #[error("request header truncated ({0} bytes)")]
    TruncatedHeader(usize),
    /// An api key Kafka does not define: close the connection.
    #[error("unknown api key {api_key} (version {api_version}, correlation id {correlation_id})")]
    UnknownApiKey {
        api_key: i16,
        api_version: i16,
        correlation_id: i32,
    },
    /// A Kafka api this broker does not serve (not in ApiVersions): close the
    /// connection, as Kafka does for apis not enabled on a listener.
    #[error(
        "api {api_key:?} is not enabled (version {api_version}, correlation id {correlation_id})"
    )]
    ApiNotEnabled {
        api_key: ApiKey,
        api_version: i16,
        correlation_id: i32,
    },
    /// A served api at a version it does not accept: answer with
    /// UNSUPPORTED_VERSION. For ApiVersions the answer is
    /// [`unsupported_api_versions_response`].
    #[error("{api_key:?} v{api_version} is not supported (correlation id {correlation_id})")]
    UnsupportedVersion {
        api_key: ApiKey,
        api_version: i16,
        correlation_id: i32,
    },
    /// The header or body does not parse, or declares lengths beyond the
    /// frame: close the connection.
    #[error(
        "malformed {api_key:?} v{api_version} request (correlation id {correlation_id}): {reason}"
    )]
    Malformed {
        api_key: ApiKey,
        api_version: i16,
        correlation_id: i32,
        reason: String,
    },
}

impl RequestError {
    /// The correlation id, when the header got far enough to carry one.
    pub fn correlation_id(&self) -> Option<i32> {
        match self {
            RequestError::TruncatedHeader(_) => None,
            RequestError::UnknownApiKey { correlation_id, .. }
            | RequestError::ApiNotEnabled { correlation_id, .. }
            | RequestError::UnsupportedVersion { correlation_id, .. }
            | RequestError::Malformed { correlation_id, .. } => Some(*correlation_id),
        }
    }
}

/// The first view taken of a frame's `Bytes` makes it shared, which
/// allocates its reference count (the `bytes` crate's `Shared`, 24 bytes).
const FRAME_VIEW_BYTES: u64 = 64;

/// A frame whose header and body the guard accepted, not yet decoded: the
/// point at which the caller knows what decoding will cost.
#[derive(Debug, Clone)]
pub struct CheckedRequest {
    frame: Bytes,
    api_key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    header_version: i16,
    decoded_bytes: u64,
}

impl CheckedRequest {
    pub fn api_key(&self) -> ApiKey {
        self.api_key
    }

    pub fn api_version(&self) -> i16 {
        self.api_version
    }

    pub fn correlation_id(&self) -> i32 {
        self.correlation_id
    }

    /// Bytes the decoder will allocate beyond the frame itself (arrays and
    /// unknown tagged fields; strings and records are views of the frame).
    /// Bounded by the guard's walk, so at most some tens of times the frame.
    pub fn decoded_bytes(&self) -> u64 {
        self.decoded_bytes
    }

    /// Decodes the request with kafka-protocol.
    pub fn decode(self) -> Result<Request, RequestError> {
        let malformed = |reason: String| RequestError::Malformed {
            api_key: self.api_key,
            api_version: self.api_version,
            correlation_id: self.correlation_id,
            reason,
        };
        let mut buf = self.frame;
        let header = RequestHeader::decode(&mut buf, self.header_version)
            .map_err(|e| malformed(format!("header: {e:#}")))?;
        let (version, newer) = match newer::decoded_as(self.api_key, self.api_version) {
            None => (self.api_version, None),
            Some(older) => match newer::split_request(self.api_key, self.api_version, &buf)
                .map_err(malformed)?
            {
                Some((body, fields)) => {
                    buf = body;
                    (older, Some(fields))
                }
                None => (older, None),
            },
        };
        let body = RequestKind::decode(self.api_key, &mut buf, version)
            .map_err(|e| malformed(format!("{e:#}")))?;
        Ok(Request {
            header,
            body,
            newer,
        })
    }
}

/// Decodes one frame body (the bytes after the size prefix).
pub fn decode_request(frame: Bytes) -> Result<Request, RequestError> {
    check_request(frame)?.decode()
}

/// Reads a frame's header, checks its version against [`crate::versions`]
/// and walks header and body with the [`crate::guard`], without decoding.
pub fn check_request(frame: Bytes) -> Result<CheckedRequest, RequestError> {
    if frame.len() < 8 {
        return Err(RequestError::TruncatedHeader(frame.len()));
    }
    let raw_api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let api_version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(api_key) = ApiKey::try_from(raw_api_key) else {
        return Err(RequestError::UnknownApiKey {
            api_key: raw_api_key,
            api_version,
            correlation_id,
        });
    };
    let Some(range) = versions::range(raw_api_key) else {
        return Err(RequestError::ApiNotEnabled {
            api_key,
            api_version,
            correlation_id,
        });
    };
    if !range.accepts(api_version) {
        return Err(RequestError::UnsupportedVersion {
            api_key,
            api_version,
            correlation_id,
        });
    }
    let malformed = |reason: String| RequestError::Malformed {
        api_key,
        api_version,
        correlation_id,
        reason,
    };
    let header_version = api_key.request_header_version(api_version);
    let header = guard::walk_request_header(header_version, &frame)
        .map_err(|e| malformed(format!("header: {e}")))?;
    let body = guard::walk_request_body(api_key, api_version, &frame[header.len..])
        .map_err(|e: GuardError| malformed(e.to_string()))?;
    let newer_copy = newer_copy_bytes(api_key, api_version, frame.len());
    Ok(CheckedRequest {
        frame,
        api_key,
        api_version,
        correlation_id,
        header_version,
        decoded_bytes: FRAME_VIEW_BYTES + header.decoded_bytes + body.decoded_bytes + newer_copy,
    })
}

/// A version newer than kafka-protocol's is decoded from a copy of its body
/// without the extra fields ([`newer::split_request`]).
fn newer_copy_bytes(api_key: ApiKey, api_version: i16, frame_len: usize) -> u64 {
    match newer::decoded_as(api_key, api_version) {
        Some(_) => FRAME_VIEW_BYTES + frame_len as u64,
        None => 0,
    }
}

#[derive(Debug, Error)]
#[error("cannot encode {api_key:?} v{api_version} response: {reason}")]
pub struct EncodeError {
    pub api_key: ApiKey,
    pub api_version: i16,
    pub reason: String,
}

/// Encodes a response as a complete size-prefixed frame, with the response
/// header version `api_key` uses at `api_version` (always v0 for ApiVersions,
/// so clients can read it before they know our versions).
pub fn encode_response(
    api_key: ApiKey,
    api_version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<Bytes, EncodeError> {
    let error = |e: anyhow::Error| EncodeError {
        api_key,
        api_version,
        reason: format!("{e:#}"),
    };
    let header_version = api_key.response_header_version(api_version);
    let mut out = BytesMut::new();
    out.put_i32(0); // size, filled in below
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, header_version)
        .map_err(error)?;
    body.encode(&mut out, newer::response_encoded_as(api_key, api_version))
        .map_err(error)?;
    let size = out.len() - SIZE_PREFIX_LEN;
    let size = i32::try_from(size).map_err(|_| EncodeError {
        api_key,
        api_version,
        reason: format!("{size} bytes do not fit a frame"),
    })?;
    out[..SIZE_PREFIX_LEN].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}

/// Kafka's UNSUPPORTED_VERSION error code.
pub const UNSUPPORTED_VERSION: i16 = 35;

/// The answer to an ApiVersions request at a version we do not support: a v0
/// response (which every client can parse) with UNSUPPORTED_VERSION and only
/// ApiVersions' own range, so the client retries at a version we know.
pub fn unsupported_api_versions_response(correlation_id: i32) -> Bytes {
    let api_keys = versions::api_versions_keys()
        .into_iter()
        .filter(|k| k.api_key == ApiKey::ApiVersions as i16)
        .collect();
    let body = ApiVersionsResponse::default()
        .with_error_code(UNSUPPORTED_VERSION)
        .with_api_keys(api_keys);
    encode_response(
        ApiKey::ApiVersions,
        0,
        correlation_id,
        &ResponseKind::ApiVersions(body),
    )
    .expect("a v0 ApiVersions response with one key always encodes")
}

/// Kafka's INVALID_OFFSET / "no timestamp" sentinel in produce responses.
const NO_OFFSET: i64 = -1;

/// The answer to a Produce v0-2 request (`frame` as given to
/// [`decode_request`], which returned [`RequestError::UnsupportedVersion`]):
/// UNSUPPORTED_VERSION for every partition it names, in the request's own
/// version, as Kafka 4 answers the versions it advertises only for
/// librdkafka's sake (KAFKA-18659). kafka-protocol cannot encode these
/// versions, so the few fields are written here. A body that does not parse
/// is [`RequestError::Malformed`]: close the connection.
pub fn unsupported_produce_response(frame: &[u8]) -> Result<Bytes, RequestError> {
    use bytes::Buf;

    let truncated = RequestError::TruncatedHeader(frame.len());
    let (Some(api_version), Some(correlation_id)) = (
        frame.get(2..4).map(|b| i16::from_be_bytes([b[0], b[1]])),
        frame
            .get(4..8)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])),
    ) else {
        return Err(truncated);
    };
    let malformed = |reason: String| RequestError::Malformed {
        api_key: ApiKey::Produce,
        api_version,
        correlation_id,
        reason,
    };
    // Produce v0-2 uses request header v1.
    let header_len =
        guard::check_request_header(1, frame).map_err(|e| malformed(format!("header: {e}")))?;
    let mut body = &frame[header_len..];
    guard::check_produce_v0_to_v2(api_version, body).map_err(|e| malformed(e.to_string()))?;

    // The guard has checked every length and count below against the body,
    // so these reads cannot run past it and the output is bounded by it.
    let mut out = BytesMut::with_capacity(frame.len() * 2);
    out.put_i32(0); // size, filled in below
    out.put_i32(correlation_id);
    body.advance(2 + 4); // acks, timeout_ms
    let topics = body.get_i32().max(0);
    out.put_i32(topics);
    for _ in 0..topics {
        let name_len = body.get_i16().max(0) as usize;
        out.put_i16(name_len as i16);
        out.put_slice(&body[..name_len]);
        body.advance(name_len);
        let partitions = body.get_i32().max(0);
        out.put_i32(partitions);
        for _ in 0..partitions {
            out.put_i32(body.get_i32()); // index
            out.put_i16(UNSUPPORTED_VERSION);
            out.put_i64(NO_OFFSET); // base_offset
            if api_version >= 2 {
                out.put_i64(NO_OFFSET); // log_append_time_ms
            }
            let records_len = body.get_i32().max(0) as usize;
            body.advance(records_len);
        }
    }
    if api_version >= 1 {
        out.put_i32(0); // throttle_time_ms
    }
    let size = (out.len() - SIZE_PREFIX_LEN) as i32;
    out[..SIZE_PREFIX_LEN].copy_from_slice(&size.to_be_bytes());
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{MetadataResponse, ProduceResponse};

    fn prefix(api_key: i16, api_version: i16, correlation_id: i32) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&api_key.to_be_bytes());
        out.extend_from_slice(&api_version.to_be_bytes());
        out.extend_from_slice(&correlation_id.to_be_bytes());
        out
    }

    #[test]
    fn short_header_is_truncated() {
        assert_eq!(
            decode_request(Bytes::from_static(&[0, 18, 0, 3, 0, 0, 0])),
            Err(RequestError::TruncatedHeader(7))
        );
    }

    #[test]
    fn unknown_api_key_carries_the_ids() {
        assert_eq!(
            decode_request(Bytes::from(prefix(9999, 1, 42))),
            Err(RequestError::UnknownApiKey {
                api_key: 9999,
                api_version: 1,
                correlation_id: 42
            })
        );
    }

    #[test]
    fn known_api_we_do_not_serve_is_not_enabled() {
        assert_eq!(
            decode_request(Bytes::from(prefix(
                ApiKey::DescribeDelegationToken as i16,
                3,
                42
            ))),
            Err(RequestError::ApiNotEnabled {
                api_key: ApiKey::DescribeDelegationToken,
                api_version: 3,
                correlation_id: 42
            })
        );
    }

    #[test]
    fn api_versions_from_the_future_gets_a_v0_unsupported_version_answer() {
        // A newer client's ApiVersions v9, flexible header and body we cannot know.
        let mut frame = prefix(ApiKey::ApiVersions as i16, 9, 77);
        frame.extend_from_slice(&[0, 4, b'c', b'l', b'i', b'x', 0, 0xAB, 0xCD]);
        let error = decode_request(Bytes::from(frame)).expect_err("unsupported");
        assert_eq!(
            error,
            RequestError::UnsupportedVersion {
                api_key: ApiKey::ApiVersions,
                api_version: 9,
                correlation_id: 77
            }
        );
        let mut answer = unsupported_api_versions_response(77);
        let size = i32::from_be_bytes(answer[..4].try_into().expect("prefix"));
        assert_eq!(size as usize, answer.len() - 4);
        let _ = answer.split_to(4);
        let header = ResponseHeader::decode(&mut answer, 0).expect("v0 header");
        assert_eq!(header.correlation_id, 77);
        let body = ApiVersionsResponse::decode(&mut answer, 0).expect("v0 body");
        assert_eq!(body.error_code, UNSUPPORTED_VERSION);
        assert_eq!(body.api_keys.len(), 1);
        assert_eq!(body.api_keys[0].api_key, 18);
        assert_eq!(
            (body.api_keys[0].min_version, body.api_keys[0].max_version),
            (0, 4)
        );
        assert!(answer.is_empty());
    }

    #[test]
    fn malformed_flexible_header_closes() {
        // Metadata v12 uses header v2; its tagged-field count says 5 but no bytes follow.
        let mut frame = prefix(ApiKey::Metadata as i16, 12, 3);
        frame.extend_from_slice(&[0xFF, 0xFF, 5]);
        assert!(matches!(
            decode_request(Bytes::from(frame)),
            Err(RequestError::Malformed {
                api_key: ApiKey::Metadata,
                correlation_id: 3,
                ..
            })
        ));
    }

    fn produce_v0_to_v2_frame(api_version: i16) -> Vec<u8> {
        let mut frame = prefix(0, api_version, 21);
        frame.extend_from_slice(&[0, 2, b'i', b'd']); // client id
        frame.extend_from_slice(&(-1i16).to_be_bytes());
        frame.extend_from_slice(&1000i32.to_be_bytes());
        frame.extend_from_slice(&2i32.to_be_bytes());
        for (name, partitions) in [(&b"a"[..], [0i32, 1]), (&b"bb"[..], [7, 8])] {
            frame.extend_from_slice(&(name.len() as i16).to_be_bytes());
            frame.extend_from_slice(name);
            frame.extend_from_slice(&2i32.to_be_bytes());
            for p in partitions {
                frame.extend_from_slice(&p.to_be_bytes());
                frame.extend_from_slice(&3i32.to_be_bytes());
                frame.extend_from_slice(b"xyz");
            }
        }
        frame
    }

    #[test]
    fn produce_v0_to_v2_gets_unsupported_version_per_partition() {
        use bytes::Buf;
        for v in 0..=2i16 {
            let frame = produce_v0_to_v2_frame(v);
            assert!(matches!(
                decode_request(Bytes::from(frame.clone())),
                Err(RequestError::UnsupportedVersion { api_version, .. }) if api_version == v
            ));
            let (header, mut rest) =
                split(unsupported_produce_response(&frame).expect("answers"), 0);
            assert_eq!(header.correlation_id, 21);
            assert_eq!(rest.get_i32(), 2);
            for (name, partitions) in [(&b"a"[..], [0, 1]), (&b"bb"[..], [7, 8])] {
                assert_eq!(rest.get_i16(), name.len() as i16);
                assert_eq!(&rest.split_to(name.len())[..], name);
                assert_eq!(rest.get_i32(), 2);
                for p in partitions {
                    assert_eq!(rest.get_i32(), p);
                    assert_eq!(rest.get_i16(), UNSUPPORTED_VERSION);
                    assert_eq!(rest.get_i64(), -1);
                    if v >= 2 {
                        assert_eq!(rest.get_i64(), -1);
                    }
                }
            }
            if v >= 1 {
                assert_eq!(rest.get_i32(), 0);
            }
            assert!(rest.is_empty());
        }
    }

    #[test]
    fn hostile_produce_v0_is_malformed_not_answered() {
        let mut frame = prefix(0, 1, 21);
        frame.extend_from_slice(&(-1i16).to_be_bytes());
        frame.extend_from_slice(&[0, 1, 0, 0, 0, 0]);
        frame.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            unsupported_produce_response(&frame),
            Err(RequestError::Malformed { .. })
        ));
        for len in 0..produce_v0_to_v2_frame(2).len() {
            assert!(unsupported_produce_response(&produce_v0_to_v2_frame(2)[..len]).is_err());
        }
    }

    fn split(mut frame: Bytes, header_version: i16) -> (ResponseHeader, Bytes) {
        let size = i32::from_be_bytes(frame[..4].try_into().expect("prefix"));
        assert_eq!(size as usize, frame.len() - 4);
        let _ = frame.split_to(4);
        let header = ResponseHeader::decode(&mut frame, header_version).expect("header");
        (header, frame)
    }

    #[test]
    fn api_versions_responses_always_use_header_v0() {
        let body = ApiVersionsResponse::default().with_api_keys(versions::api_versions_keys());
        let frame = encode_response(
            ApiKey::ApiVersions,
            3,
            11,
            &ResponseKind::ApiVersions(body.clone()),
        )
        .expect("encodes");
        let (header, mut rest) = split(frame, 0);
        assert_eq!(header.correlation_id, 11);
        assert_eq!(
            ApiVersionsResponse::decode(&mut rest, 3).expect("body"),
            body
        );
        assert!(rest.is_empty());
    }

    #[test]
    fn flexible_responses_use_header_v1() {
        let body = MetadataResponse::default().with_cluster_id(Some("c".into()));
        let frame = encode_response(
            ApiKey::Metadata,
            12,
            5,
            &ResponseKind::Metadata(body.clone()),
        )
        .expect("encodes");
        let (header, mut rest) = split(frame, 1);
        assert_eq!(header.correlation_id, 5);
        assert_eq!(MetadataResponse::decode(&mut rest, 12).expect("body"), body);
        assert!(rest.is_empty());

        let frame = encode_response(
            ApiKey::Produce,
            8,
            6,
            &ResponseKind::Produce(ProduceResponse::default()),
        )
        .expect("encodes");
        let (header, mut rest) = split(frame, 0);
        assert_eq!(header.correlation_id, 6);
        ProduceResponse::decode(&mut rest, 8).expect("body");
        assert!(rest.is_empty());
    }
}
