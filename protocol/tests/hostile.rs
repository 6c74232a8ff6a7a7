//! Hostile input never panics, never aborts on a huge allocation, and is
//! refused. Without the guard, kafka-protocol would `Vec::with_capacity` the
//! forged counts below and abort the test process.

mod common;

use bytes::Bytes;
use common::{all_apis, build, encode};
use kafka_protocol::messages::ApiKey;
use proptest::prelude::*;
use protocol::guard::{check_request_body, guarded_versions};
use protocol::versions::SUPPORTED_APIS;
use protocol::{decode_request, RequestError};

/// Every valid frame of every guarded api version, with its header length.
fn valid_frames() -> Vec<(ApiKey, i16, Bytes, usize)> {
    let mut out = Vec::new();
    for api in all_apis() {
        let (min, max) = guarded_versions(api.api_key).expect("guarded");
        for v in min..=max {
            let (frame, header_len) = encode(api.api_key, v, &build(api.api_key, v));
            out.push((api.api_key, v, frame, header_len));
        }
    }
    out
}

/// Runs both entry points; only their not panicking is asserted here.
fn exercise(api_key: ApiKey, v: i16, frame: &[u8], header_len: usize) {
    let _ = decode_request(Bytes::copy_from_slice(frame));
    let _ = check_request_body(api_key, v, &frame[header_len..]);
}

#[test]
fn forged_huge_counts_at_every_position_are_survived() {
    let forgeries: [&[u8]; 4] = [
        &i32::MAX.to_be_bytes(),
        &0x0010_0000i32.to_be_bytes(),
        &[0xFF, 0xFF, 0xFF, 0xFF, 0x0F], // compact count u32::MAX
        &[0x80, 0x80, 0x80, 0x40],       // compact count 2^27
    ];
    for (api_key, v, frame, header_len) in valid_frames() {
        for at in header_len..frame.len() {
            for forged in forgeries {
                let mut hostile = frame.to_vec();
                let end = (at + forged.len()).min(hostile.len());
                hostile[at..end].copy_from_slice(&forged[..end - at]);
                exercise(api_key, v, &hostile, header_len);
            }
        }
    }
}

#[test]
fn forged_count_in_a_served_request_is_refused_as_malformed() {
    // Metadata v0: topics array count, then nothing.
    let mut frame = vec![0, 3, 0, 0, 0, 0, 0, 5, 0xFF, 0xFF];
    frame.extend_from_slice(&i32::MAX.to_be_bytes());
    frame.extend_from_slice(&[0, 1, b'a']);
    let error = decode_request(Bytes::from(frame)).expect_err("refused");
    assert!(
        matches!(
            error,
            RequestError::Malformed {
                api_key: ApiKey::Metadata,
                correlation_id: 5,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn every_truncation_of_every_served_request_is_refused() {
    for (api_key, v, frame, _) in valid_frames() {
        let served = SUPPORTED_APIS
            .iter()
            .any(|r| r.api_key == api_key && r.accepts(v));
        if !served {
            continue;
        }
        for len in 0..frame.len() {
            let result = decode_request(frame.slice(..len));
            assert!(
                result.is_err(),
                "{api_key:?} v{v} truncated to {len} decoded"
            );
            if len >= 8 {
                assert_eq!(
                    result.unwrap_err().correlation_id(),
                    Some(common::CORRELATION_ID)
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_request(Bytes::from(bytes));
    }

    #[test]
    fn random_bodies_behind_a_valid_header_never_panic(
        index in 0usize..1000,
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let frames = valid_frames();
        let (api_key, v, frame, header_len) = &frames[index % frames.len()];
        let mut hostile = frame[..*header_len].to_vec();
        hostile.extend_from_slice(&body);
        exercise(*api_key, *v, &hostile, *header_len);
    }

    #[test]
    fn mutated_valid_requests_never_panic(
        index in 0usize..1000,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let frames = valid_frames();
        let (api_key, v, frame, header_len) = &frames[index % frames.len()];
        let mut hostile = frame.to_vec();
        for (at, byte) in flips {
            let at = at.index(hostile.len());
            hostile[at] = byte;
        }
        exercise(*api_key, *v, &hostile, *header_len);
    }
}
