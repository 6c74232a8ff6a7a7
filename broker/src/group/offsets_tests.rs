//! Tests of the `__consumer_offsets` record formats (against byte strings
//! written out by hand from Kafka's JSON schemas) and of the offset store.

use std::collections::BTreeSet;

use bytes::Bytes;
use proptest::prelude::*;
use uuid::Uuid;

use super::records::{
    decode, decode_group_metadata_value, decode_offset_commit_value, encode,
    encode_group_metadata_value, encode_offset_commit_value, offset_commit_value_version,
    GROUP_METADATA_VALUE_MAX_VERSION, OFFSET_COMMIT_VALUE_MAX_VERSION,
};
use super::*;

/// Concatenates byte fields, so each vector below reads field by field.
fn cat(fields: &[&[u8]]) -> Vec<u8> {
    fields.concat()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn offset(committed_offset: i64, commit_timestamp_ms: i64) -> OffsetAndMetadata {
    OffsetAndMetadata {
        committed_offset,
        committed_leader_epoch: None,
        metadata: String::new(),
        commit_timestamp_ms,
        expire_timestamp_ms: None,
        topic_id: None,
    }
}

fn commit(
    group_id: &str,
    topic: &str,
    partition: i32,
    value: OffsetAndMetadata,
) -> CoordinatorRecord {
    CoordinatorRecord::OffsetCommit {
        group_id: group_id.into(),
        topic: topic.into(),
        partition,
        value: Some(value),
    }
}

fn tombstone(group_id: &str, topic: &str, partition: i32) -> CoordinatorRecord {
    CoordinatorRecord::OffsetCommit {
        group_id: group_id.into(),
        topic: topic.into(),
        partition,
        value: None,
    }
}

fn group_tombstone(group_id: &str) -> CoordinatorRecord {
    CoordinatorRecord::GroupMetadata {
        group_id: group_id.into(),
        value: None,
    }
}

fn sample_group_metadata() -> GroupMetadata {
    GroupMetadata {
        protocol_type: Some("consumer".into()),
        generation_id: GenerationId(5),
        protocol_name: Some("range".into()),
        leader: Some(MemberId::from("m1")),
        current_state_timestamp_ms: 1_700_000_000_000,
        members: vec![MemberMetadata {
            member_id: MemberId::from("m1"),
            group_instance_id: Some(GroupInstanceId::from("i1")),
            client_id: "c".into(),
            client_host: "/h".into(),
            rebalance_timeout_ms: 300_000,
            session_timeout_ms: 45_000,
            subscription: Bytes::from_static(&[1, 2]),
            assignment: Bytes::from_static(&[3]),
        }],
    }
}

fn empty_group_metadata() -> GroupMetadata {
    GroupMetadata {
        protocol_type: None,
        generation_id: GenerationId(0),
        protocol_name: None,
        leader: None,
        current_state_timestamp_ms: -1,
        members: Vec::new(),
    }
}

// ---- keys ----

#[test]
fn offset_commit_key_is_type_1_group_topic_partition() {
    let key = cat(&[&[0, 1], &[0, 2], b"g1", &[0, 1], b"t", &[0, 0, 0, 3]]);
    let record = commit("g1", "t", 3, offset(42, 7));
    let (encoded, _) = encode(&record).unwrap();
    assert_eq!(&encoded[..], &key[..]);
    assert_eq!(
        decode(&key, None).unwrap(),
        tombstone("g1", "t", 3),
        "a key without a value is a tombstone"
    );
}

#[test]
fn legacy_offset_commit_key_type_0_reads_like_type_1() {
    let key = cat(&[
        &[0, 0],
        &[0, 1],
        b"g",
        &[0, 2],
        b"tp",
        &[0xff, 0xff, 0xff, 0xff],
    ]);
    assert_eq!(decode(&key, None).unwrap(), tombstone("g", "tp", -1));
}

#[test]
fn group_metadata_key_is_type_2_group() {
    let key = cat(&[&[0, 2], &[0, 3], b"grp"]);
    let (encoded, value) = encode(&group_tombstone("grp")).unwrap();
    assert_eq!(&encoded[..], &key[..]);
    assert_eq!(value, None);
    assert_eq!(decode(&key, None).unwrap(), group_tombstone("grp"));
}

#[test]
fn share_and_unknown_key_types_decode_as_other_without_parsing() {
    // Type 9 and up (share and streams groups, newer types): the group id
    // and a value this module does not parse; the value bytes need not even
    // be well formed.
    let key = cat(&[&[0, 9], &[0, 1], b"g"]);
    let value = [0u8, 0, 0xde, 0xad];
    let record = decode(&key, Some(&value)).unwrap();
    assert_eq!(
        record,
        CoordinatorRecord::Other {
            key_version: 9,
            key: Bytes::copy_from_slice(&key),
            value: Some(Bytes::copy_from_slice(&value)),
        }
    );
    // Written back unchanged.
    let (k, v) = encode(&record).unwrap();
    assert_eq!(&k[..], &key[..]);
    assert_eq!(v.as_deref(), Some(&value[..]));
    for key_version in [9i16, 15, 16, 100, i16::MAX, -1] {
        let key = key_version.to_be_bytes();
        assert!(matches!(
            decode(&key, None),
            Ok(CoordinatorRecord::Other { key_version: v, .. }) if v == key_version
        ));
    }
}

#[test]
fn kip848_key_types_are_parsed_so_a_malformed_one_fails_the_load() {
    // ConsumerGroupMetadataKey (type 3) with a truncated value: Kafka's
    // loader fails on it, and so does this decoder now that it knows the type.
    let key = cat(&[&[0, 3], &[0, 1], b"g"]);
    assert!(decode(&key, Some(&[0u8, 0, 0xde, 0xad])).is_err());
    assert!(matches!(
        decode(&key, None),
        Ok(CoordinatorRecord::ConsumerGroup(_))
    ));
}

// ---- OffsetCommitValue, every version ----

const OFFSET_42: [u8; 8] = [0, 0, 0, 0, 0, 0, 0, 42];
const TS_1000: [u8; 8] = [0, 0, 0, 0, 0, 0, 0x03, 0xe8];
const TS_5000: [u8; 8] = [0, 0, 0, 0, 0, 0, 0x13, 0x88];
const MINUS_ONE_I64: [u8; 8] = [0xff; 8];

fn offset_key() -> Vec<u8> {
    cat(&[&[0, 1], &[0, 1], b"g", &[0, 1], b"t", &[0, 0, 0, 0]])
}

fn decode_offset_value(value: &[u8]) -> OffsetAndMetadata {
    match decode(&offset_key(), Some(value)).unwrap() {
        CoordinatorRecord::OffsetCommit { value: Some(v), .. } => v,
        other => panic!("not an offset commit: {other:?}"),
    }
}

#[test]
fn offset_commit_value_v0_and_v2_offset_metadata_commit_timestamp() {
    for version in [0u8, 2] {
        let value = cat(&[&[0, version], &OFFSET_42, &[0, 2], b"md", &TS_1000]);
        assert_eq!(
            decode_offset_value(&value),
            OffsetAndMetadata {
                committed_offset: 42,
                committed_leader_epoch: None,
                metadata: "md".into(),
                commit_timestamp_ms: 1000,
                expire_timestamp_ms: None,
                topic_id: None,
            },
            "v{version}"
        );
    }
}

#[test]
fn offset_commit_value_v1_has_an_expire_timestamp() {
    let value = cat(&[&[0, 1], &OFFSET_42, &[0, 0], &TS_1000, &TS_5000]);
    let decoded = decode_offset_value(&value);
    assert_eq!(decoded.expire_timestamp_ms, Some(5000));
    assert_eq!(decoded.metadata, "");
    // The -1 sentinel reads as no expire timestamp, as in Kafka.
    let value = cat(&[&[0, 1], &OFFSET_42, &[0, 0], &TS_1000, &MINUS_ONE_I64]);
    assert_eq!(decode_offset_value(&value).expire_timestamp_ms, None);
}

#[test]
fn offset_commit_value_v3_has_a_leader_epoch() {
    let value = cat(&[&[0, 3], &OFFSET_42, &[0, 0, 0, 7], &[0, 1], b"x", &TS_1000]);
    let decoded = decode_offset_value(&value);
    assert_eq!(decoded.committed_leader_epoch, Some(7));
    assert_eq!(decoded.metadata, "x");
    let value = cat(&[&[0, 3], &OFFSET_42, &[0xff; 4], &[0, 0], &TS_1000]);
    assert_eq!(decode_offset_value(&value).committed_leader_epoch, None);
}

#[test]
fn offset_commit_value_v4_is_flexible() {
    // Compact string: varint(len + 1); then an empty tagged-field section.
    let value = cat(&[
        &[0, 4],
        &OFFSET_42,
        &[0, 0, 0, 7],
        &[3],
        b"md",
        &TS_1000,
        &[0],
    ]);
    let expected = OffsetAndMetadata {
        committed_offset: 42,
        committed_leader_epoch: Some(7),
        metadata: "md".into(),
        commit_timestamp_ms: 1000,
        expire_timestamp_ms: None,
        topic_id: None,
    };
    assert_eq!(decode_offset_value(&value), expected);
    assert_eq!(
        &encode_offset_commit_value(&expected, 4).unwrap()[..],
        &value[..]
    );
    // Tag 0 is the topic id (16 bytes); unknown tag 5 is skipped. Kafka
    // 4.4.0's serde reads this same vector as topicId=q6urq6urq6urq6urq6urqw.
    let mut tagged = cat(&[&[0, 4], &OFFSET_42, &[0, 0, 0, 7], &[3], b"md", &TS_1000]);
    tagged.extend_from_slice(&cat(&[&[2], &[0, 16], &[0xab; 16], &[5, 2, 1, 2]]));
    assert_eq!(
        decode_offset_value(&tagged),
        OffsetAndMetadata {
            topic_id: Some(Uuid::from_bytes([0xab; 16])),
            ..expected.clone()
        }
    );
    // The zero UUID is Kafka's default: no topic id.
    let mut zero = cat(&[&[0, 4], &OFFSET_42, &[0, 0, 0, 7], &[3], b"md", &TS_1000]);
    zero.extend_from_slice(&cat(&[&[1], &[0, 16], &[0; 16]]));
    assert_eq!(decode_offset_value(&zero), expected);
    // A topic id that is not 16 bytes is malformed.
    let mut short = cat(&[&[0, 4], &OFFSET_42, &[0, 0, 0, 7], &[3], b"md", &TS_1000]);
    short.extend_from_slice(&cat(&[&[1], &[0, 2], &[1, 2]]));
    assert!(matches!(
        decode(&offset_key(), Some(&short)),
        Err(RecordFormatError::InvalidLength { .. })
    ));
    // A metadata string of 200 bytes needs a two-byte varint (201 = 0xc9 0x01).
    let long = "m".repeat(200);
    let value = cat(&[
        &[0, 4],
        &OFFSET_42,
        &[0xff; 4],
        &[0xc9, 0x01],
        long.as_bytes(),
        &TS_1000,
        &[0],
    ]);
    assert_eq!(decode_offset_value(&value).metadata, long);
}

/// Byte strings produced by Apache Kafka 4.4.0 itself
/// (`GroupCoordinatorRecordHelpers.newOffsetCommitRecord` and
/// `newOffsetCommitTombstoneRecord` serialized by
/// `GroupCoordinatorRecordSerde`, run in jshell against the 4.4.0 jars).
#[test]
fn offset_commits_are_written_byte_for_byte_as_kafka_4_4_writes_them() {
    let key = unhex("00010002673100017400000003");
    let mut value = OffsetAndMetadata {
        committed_offset: 42,
        committed_leader_epoch: Some(7),
        metadata: "md".into(),
        commit_timestamp_ms: 1000,
        expire_timestamp_ms: None,
        topic_id: None,
    };
    let topic_id = 0x0102030405060708090a0b0c0d0e0f10u128;
    let cases = [
        // v4, topic id unknown (Uuid.ZERO_UUID): no tagged field.
        (None, None, "0004000000000000002a00000007036d6400000000000003e800"),
        // v4 with the topic id as tagged field 0.
        (
            Some(topic_id),
            None,
            "0004000000000000002a00000007036d6400000000000003e80100100102030405060708090a0b0c0d0e0f10",
        ),
        // v1 when an expire timestamp is set: leader epoch and topic id dropped.
        (
            Some(topic_id),
            Some(5000),
            "0001000000000000002a00026d6400000000000003e80000000000001388",
        ),
    ];
    for (topic_id, expire_ms, kafka_value) in cases {
        value.topic_id = topic_id.map(Uuid::from_u128);
        value.expire_timestamp_ms = expire_ms;
        let (k, v) = encode(&commit("g1", "t", 3, value.clone())).unwrap();
        assert_eq!(&k[..], &key[..]);
        assert_eq!(v.as_deref(), Some(&unhex(kafka_value)[..]), "{kafka_value}");
        let mut expected = value.clone();
        if expire_ms.is_some() {
            expected.committed_leader_epoch = None;
            expected.topic_id = None;
        }
        assert_eq!(decode_offset_value(&unhex(kafka_value)), expected);
    }
    let (k, v) = encode(&tombstone("g1", "t", 3)).unwrap();
    assert_eq!((&k[..], v), (&key[..], None));
}

#[test]
fn legacy_offset_commit_key_only_takes_a_version_0_value() {
    // Kafka reads a type-0 key's value as LegacyOffsetCommitValue (v0 only).
    let key = unhex("00000001670002747000000001");
    let v0 = unhex("0000000000000000002a00026d6400000000000003e8");
    let expected = OffsetAndMetadata {
        metadata: "md".into(),
        ..offset(42, 1000)
    };
    assert_eq!(
        decode(&key, Some(&v0)).unwrap(),
        commit("g", "tp", 1, expected)
    );
    let v3 = unhex("0003000000000000002a0000000700026d6400000000000003e8");
    assert_eq!(
        decode(&key, Some(&v3)),
        Err(RecordFormatError::UnknownValueVersion {
            record: "LegacyOffsetCommitValue",
            version: 3
        })
    );
}

// ---- GroupMetadataValue, every version ----

fn member_fields(version: u8, flexible: bool) -> Vec<u8> {
    let s = |b: &[u8]| -> Vec<u8> {
        if flexible {
            cat(&[&[b.len() as u8 + 1], b])
        } else {
            cat(&[&[0, b.len() as u8], b])
        }
    };
    let bytes = |b: &[u8]| -> Vec<u8> {
        if flexible {
            cat(&[&[b.len() as u8 + 1], b])
        } else {
            cat(&[&[0, 0, 0, b.len() as u8], b])
        }
    };
    let mut out = s(b"m1");
    if version >= 3 {
        out.extend(s(b"i1"));
    }
    out.extend(s(b"c"));
    out.extend(s(b"/h"));
    if version >= 1 {
        out.extend([0x00, 0x04, 0x93, 0xe0]); // rebalanceTimeout 300000
    }
    out.extend([0x00, 0x00, 0xaf, 0xc8]); // sessionTimeout 45000
    out.extend(bytes(&[1, 2]));
    out.extend(bytes(&[3]));
    if flexible {
        out.push(0);
    }
    out
}

/// GroupMetadataValue of [`sample_group_metadata`] at `version`, written
/// field by field from the schema.
fn group_metadata_vector(version: u8) -> Vec<u8> {
    let flexible = version >= 4;
    let s = |b: &[u8]| -> Vec<u8> {
        if flexible {
            cat(&[&[b.len() as u8 + 1], b])
        } else {
            cat(&[&[0, b.len() as u8], b])
        }
    };
    let mut out = vec![0, version];
    out.extend(s(b"consumer"));
    out.extend([0, 0, 0, 5]);
    out.extend(s(b"range"));
    out.extend(s(b"m1"));
    if version >= 2 {
        out.extend(1_700_000_000_000i64.to_be_bytes());
    }
    if flexible {
        out.push(2); // one member
    } else {
        out.extend([0, 0, 0, 1]);
    }
    out.extend(member_fields(version, flexible));
    if flexible {
        out.push(0);
    }
    out
}

#[test]
fn group_metadata_value_every_version_from_hand_written_bytes() {
    for version in 0..=4u8 {
        let bytes = group_metadata_vector(version);
        let decoded = decode_group_metadata_value(&bytes).unwrap();
        let mut expected = sample_group_metadata();
        if version < 3 {
            expected.members[0].group_instance_id = None;
        }
        if version < 2 {
            expected.current_state_timestamp_ms = -1;
        }
        if version < 1 {
            expected.members[0].rebalance_timeout_ms = -1;
        }
        assert_eq!(decoded, expected, "v{version}");
        // Our writer produces the same bytes at that version.
        assert_eq!(
            &encode_group_metadata_value(&decoded, i16::from(version)).unwrap()[..],
            &bytes[..],
            "v{version}"
        );
    }
}

/// `GroupMetadataValue` of [`sample_group_metadata`] at versions 0..=4 as
/// Kafka 4.4.0's `GroupCoordinatorRecordSerde` serializes it.
const KAFKA_GROUP_METADATA_VALUES: [&str; 5] = [
    "00000008636f6e73756d657200000005000572616e676500026d310000000100026d3100016300022f680000afc80000000201020000000103",
    "00010008636f6e73756d657200000005000572616e676500026d310000000100026d3100016300022f68000493e00000afc80000000201020000000103",
    "00020008636f6e73756d657200000005000572616e676500026d310000018bcfe568000000000100026d3100016300022f68000493e00000afc80000000201020000000103",
    "00030008636f6e73756d657200000005000572616e676500026d310000018bcfe568000000000100026d310002693100016300022f68000493e00000afc80000000201020000000103",
    "000409636f6e73756d6572000000050672616e6765036d310000018bcfe5680002036d310369310263032f68000493e00000afc803010202030000",
];

#[test]
fn hand_written_group_metadata_vectors_equal_kafka_4_4_output() {
    for (version, kafka) in KAFKA_GROUP_METADATA_VALUES.iter().enumerate() {
        assert_eq!(
            group_metadata_vector(version as u8),
            unhex(kafka),
            "v{version}"
        );
    }
    // Kafka 4.4.0 writes the group key as type 2.
    let (key, _) = encode(&group_tombstone("grp")).unwrap();
    assert_eq!(&key[..], &unhex("00020003677270")[..]);
}

#[test]
fn kafka_4_writes_group_metadata_value_v3() {
    let record = CoordinatorRecord::GroupMetadata {
        group_id: "g".into(),
        value: Some(sample_group_metadata()),
    };
    let (_, value) = encode(&record).unwrap();
    assert_eq!(value.as_deref(), Some(&group_metadata_vector(3)[..]));
}

#[test]
fn group_metadata_value_nulls_and_empty_protocol_type() {
    // v3, protocolType "", protocol null, leader null, no members: what
    // Kafka's newEmptyGroupMetadataRecord writes.
    let bytes = cat(&[
        &[0, 3],
        &[0, 0],
        &[0, 0, 0, 0],
        &[0xff, 0xff],
        &[0xff, 0xff],
        &MINUS_ONE_I64,
        &[0, 0, 0, 0],
    ]);
    assert_eq!(
        decode_group_metadata_value(&bytes).unwrap(),
        empty_group_metadata()
    );
    assert_eq!(
        &encode_group_metadata_value(&empty_group_metadata(), 3).unwrap()[..],
        &bytes[..]
    );
    // The same in v4's compact form: 1 = "", 0 = null, 1 = no members.
    let bytes = cat(&[
        &[0, 4],
        &[1],
        &[0, 0, 0, 0],
        &[0],
        &[0],
        &MINUS_ONE_I64,
        &[1],
        &[0],
    ]);
    assert_eq!(
        decode_group_metadata_value(&bytes).unwrap(),
        empty_group_metadata()
    );
    // Kafka reads a compact length in Java int arithmetic: varint
    // 0xffffffff is -1, minus one is negative, so the string is null.
    let wrapped = cat(&[
        &[0, 4],
        &[1],
        &[0, 0, 0, 0],
        &[0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0],
        &MINUS_ONE_I64,
        &[1],
        &[0],
    ]);
    assert_eq!(
        decode_group_metadata_value(&wrapped).unwrap(),
        empty_group_metadata()
    );
}

#[test]
fn group_metadata_value_v4_skips_unknown_tagged_fields_at_both_levels() {
    let mut bytes = group_metadata_vector(4);
    // Replace the member's and the top level's empty tag sections.
    let top = bytes.pop();
    assert_eq!(top, Some(0));
    let member = bytes.pop();
    assert_eq!(member, Some(0));
    bytes.extend([1, 9, 3, 0xaa, 0xbb, 0xcc]); // member: tag 9, 3 bytes
    bytes.extend([2, 0, 0, 1, 1, 0x7f]); // top: tag 0 empty, tag 1 one byte
    let decoded = decode_group_metadata_value(&bytes).unwrap();
    assert_eq!(decoded, sample_group_metadata());
}

// ---- malformed input ----

#[test]
fn malformed_records_are_errors() {
    use RecordFormatError as E;
    assert!(matches!(decode(&[], None), Err(E::Truncated { .. })));
    assert!(matches!(decode(&[0], None), Err(E::Truncated { .. })));
    // Group length 5 with 1 byte present.
    assert!(matches!(
        decode(&[0, 1, 0, 5, b'g'], None),
        Err(E::Truncated { .. })
    ));
    // Null group id.
    assert!(matches!(
        decode(&[0, 2, 0xff, 0xff], None),
        Err(E::UnexpectedNull { .. })
    ));
    // Invalid UTF-8 is replaced, as Kafka's `new String(bytes, UTF_8)`
    // does (Kafka 4.4.0 loads this key).
    assert_eq!(
        decode(&[0, 2, 0, 1, 0xff], None).unwrap(),
        group_tombstone("\u{fffd}")
    );
    // Missing partition.
    assert!(matches!(
        decode(&cat(&[&[0, 1], &[0, 1], b"g", &[0, 1], b"t"]), None),
        Err(E::Truncated { .. })
    ));
    // Value versions Kafka does not define.
    for version in [5i16, -1, 100] {
        let value = cat(&[&version.to_be_bytes(), &OFFSET_42, &[0, 0], &TS_1000]);
        assert!(matches!(
            decode(&offset_key(), Some(&value)),
            Err(E::UnknownValueVersion { .. })
        ));
        assert!(matches!(
            decode_group_metadata_value(&version.to_be_bytes()),
            Err(E::UnknownValueVersion { .. })
        ));
    }
    // Empty value (not a tombstone: a tombstone is no value at all).
    assert!(matches!(
        decode(&offset_key(), Some(&[])),
        Err(E::Truncated { .. })
    ));
    // A member count far beyond the bytes present is refused before
    // anything is allocated.
    let huge = cat(&[
        &[0, 3],
        &[0, 0],
        &[0, 0, 0, 0],
        &[0xff, 0xff],
        &[0xff, 0xff],
        &MINUS_ONE_I64,
        &[0x7f, 0xff, 0xff, 0xff],
    ]);
    assert!(matches!(
        decode_group_metadata_value(&huge),
        Err(E::InvalidLength { .. })
    ));
    // Negative (null) member array.
    let null_members = cat(&[
        &[0, 3],
        &[0, 0],
        &[0, 0, 0, 0],
        &[0xff, 0xff],
        &[0xff, 0xff],
        &MINUS_ONE_I64,
        &[0xff; 4],
    ]);
    assert!(matches!(
        decode_group_metadata_value(&null_members),
        Err(E::UnexpectedNull { .. })
    ));
    // Bytes after the last field are ignored, as Kafka ignores them.
    assert_eq!(
        decode(&unhex("0002000167ffff"), None).unwrap(),
        group_tombstone("g")
    );
    // A varint of six bytes.
    let long_varint = cat(&[
        &[0, 4],
        &OFFSET_42,
        &[0; 4],
        &[0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
    ]);
    assert!(matches!(
        decode_offset_commit_value(&long_varint),
        Err(E::VarintTooLong { .. })
    ));
    // Compact string longer than Kafka's limit (varint 40000 + 1).
    let too_long = cat(&[&[0, 4], &OFFSET_42, &[0; 4], &[0xc1, 0xb8, 0x02]]);
    assert!(matches!(
        decode_offset_commit_value(&too_long),
        Err(E::InvalidLength { .. })
    ));
    // Tagged field whose size runs past the end.
    let bad_tag = cat(&[&[0, 4], &OFFSET_42, &[0; 4], &[1], &TS_1000, &[1, 0, 50, 1]]);
    assert!(matches!(
        decode_offset_commit_value(&bad_tag),
        Err(E::Truncated { .. })
    ));
}

#[test]
fn strings_longer_than_kafka_allows_are_not_encoded() {
    let long = "g".repeat(i16::MAX as usize + 1);
    assert!(matches!(
        encode(&group_tombstone(&long)),
        Err(RecordFormatError::StringTooLong { .. })
    ));
    let ok = "g".repeat(i16::MAX as usize);
    let (key, _) = encode(&group_tombstone(&ok)).unwrap();
    assert_eq!(decode(&key, None).unwrap(), group_tombstone(&ok));
}

// ---- round trips ----

fn arb_offset() -> impl Strategy<Value = OffsetAndMetadata> {
    (
        any::<i64>(),
        prop::option::of(0..i32::MAX),
        "\\PC{0,20}",
        any::<i64>(),
        prop::option::of(0..i64::MAX),
        prop::option::of(1..=u128::MAX),
    )
        .prop_map(|(o, e, m, c, x, t)| OffsetAndMetadata {
            committed_offset: o,
            committed_leader_epoch: e,
            metadata: m,
            commit_timestamp_ms: c,
            expire_timestamp_ms: x,
            topic_id: t.map(Uuid::from_u128),
        })
}

fn arb_member() -> impl Strategy<Value = MemberMetadata> {
    (
        "[a-z0-9-]{0,12}",
        prop::option::of("[a-z]{1,6}"),
        "\\PC{0,8}",
        "\\PC{0,8}",
        any::<i32>(),
        any::<i32>(),
        prop::collection::vec(any::<u8>(), 0..200),
        prop::collection::vec(any::<u8>(), 0..20),
    )
        .prop_map(|(m, i, c, h, r, s, sub, asg)| MemberMetadata {
            member_id: MemberId(m),
            group_instance_id: i.map(GroupInstanceId),
            client_id: c,
            client_host: h,
            rebalance_timeout_ms: r,
            session_timeout_ms: s,
            subscription: Bytes::from(sub),
            assignment: Bytes::from(asg),
        })
}

fn arb_group_metadata() -> impl Strategy<Value = GroupMetadata> {
    (
        prop::option::of("[a-z]{1,8}"),
        any::<i32>(),
        prop::option::of("\\PC{0,8}"),
        prop::option::of("[a-z0-9-]{0,12}"),
        any::<i64>(),
        prop::collection::vec(arb_member(), 0..4),
    )
        .prop_map(|(t, g, p, l, ts, members)| GroupMetadata {
            protocol_type: t,
            generation_id: GenerationId(g),
            protocol_name: p,
            leader: l.map(MemberId),
            current_state_timestamp_ms: ts,
            members,
        })
}

/// What survives a write at `version`: the fields it lacks read back as
/// the schema's defaults.
fn offset_at_version(mut o: OffsetAndMetadata, version: i16) -> OffsetAndMetadata {
    if version < 3 {
        o.committed_leader_epoch = None;
    }
    if version != 1 {
        o.expire_timestamp_ms = None;
    }
    if version < 4 {
        o.topic_id = None;
    }
    o
}

fn group_at_version(mut g: GroupMetadata, version: i16) -> GroupMetadata {
    if version < 2 {
        g.current_state_timestamp_ms = -1;
    }
    for m in &mut g.members {
        if version < 3 {
            m.group_instance_id = None;
        }
        if version < 1 {
            m.rebalance_timeout_ms = -1;
        }
    }
    g
}

proptest! {
    #[test]
    fn decode_never_panics_on_arbitrary_bytes(
        key in prop::collection::vec(any::<u8>(), 0..64),
        value in prop::option::of(prop::collection::vec(any::<u8>(), 0..256)),
    ) {
        let _ = decode(&key, value.as_deref());
    }

    #[test]
    fn decode_never_panics_on_arbitrary_values_of_known_types(
        key_version in 0i16..=2,
        value in prop::collection::vec(any::<u8>(), 0..256),
        value_version in -1i16..=5,
    ) {
        let mut key = key_version.to_be_bytes().to_vec();
        key.extend([0, 1, b'g', 0, 1, b't', 0, 0, 0, 0]);
        let mut v = value_version.to_be_bytes().to_vec();
        v.extend(value);
        let _ = decode(&key, Some(&v));
    }

    #[test]
    fn offset_commit_round_trips(
        group_id in "\\PC{0,16}",
        topic in "[a-zA-Z0-9._-]{1,20}",
        partition in any::<i32>(),
        value in prop::option::of(arb_offset()),
    ) {
        // A v1 write (explicit expire timestamp) drops the leader epoch, as
        // Kafka's does.
        let expected = CoordinatorRecord::OffsetCommit {
            group_id: group_id.clone(),
            topic: topic.clone(),
            partition,
            value: value.clone().map(|v| {
                let version = offset_commit_value_version(&v);
                offset_at_version(v, version)
            }),
        };
        let record = CoordinatorRecord::OffsetCommit { group_id, topic, partition, value };
        let (k, v) = encode(&record).unwrap();
        prop_assert_eq!(decode(&k, v.as_deref()).unwrap(), expected);
    }

    #[test]
    fn offset_commit_value_round_trips_at_every_version(value in arb_offset(), version in 0..=OFFSET_COMMIT_VALUE_MAX_VERSION) {
        let bytes = encode_offset_commit_value(&value, version).unwrap();
        prop_assert_eq!(decode_offset_commit_value(&bytes).unwrap(), (offset_at_version(value, version), version));
    }

    #[test]
    fn group_metadata_round_trips(group_id in "\\PC{0,16}", value in prop::option::of(arb_group_metadata())) {
        let record = CoordinatorRecord::GroupMetadata { group_id, value };
        let (k, v) = encode(&record).unwrap();
        prop_assert_eq!(decode(&k, v.as_deref()).unwrap(), record);
    }

    #[test]
    fn group_metadata_value_round_trips_at_every_version(value in arb_group_metadata(), version in 0..=GROUP_METADATA_VALUE_MAX_VERSION) {
        let bytes = encode_group_metadata_value(&value, version).unwrap();
        prop_assert_eq!(decode_group_metadata_value(&bytes).unwrap(), group_at_version(value, version));
    }

    #[test]
    fn truncating_a_valid_value_is_an_error_not_a_panic(value in arb_group_metadata(), version in 0..=GROUP_METADATA_VALUE_MAX_VERSION, cut in any::<prop::sample::Index>()) {
        let bytes = encode_group_metadata_value(&value, version).unwrap();
        let cut = cut.index(bytes.len());
        prop_assert!(decode_group_metadata_value(&bytes[..cut]).is_err());
    }
}

// ---- the store ----

#[test]
fn apply_then_fetch_last_write_wins() {
    let mut store = OffsetStore::new();
    assert_eq!(store.fetch("g", "t", 0), None);
    store.apply(&commit("g", "t", 0, offset(10, 1)));
    store.apply(&commit("g", "t", 0, offset(20, 2)));
    store.apply(&commit("g", "t", 1, offset(5, 2)));
    assert_eq!(store.fetch("g", "t", 0), Some(&offset(20, 2)));
    assert_eq!(store.fetch("g", "t", 1), Some(&offset(5, 2)));
    assert_eq!(store.fetch("g", "u", 0), None);
    assert_eq!(store.fetch("h", "t", 0), None);
    // A lower offset committed later still wins: the log's order decides.
    store.apply(&commit("g", "t", 0, offset(3, 3)));
    assert_eq!(store.fetch("g", "t", 0), Some(&offset(3, 3)));
}

#[test]
fn tombstones_delete_and_prune_the_group() {
    let mut store = OffsetStore::new();
    store.apply(&commit("g", "t", 0, offset(10, 1)));
    store.apply(&commit("g", "t", 1, offset(11, 1)));
    store.apply(&tombstone("g", "t", 0));
    assert_eq!(store.fetch("g", "t", 0), None);
    assert!(store.has_offsets("g"));
    // A tombstone for something absent is a no-op.
    store.apply(&tombstone("g", "t", 7));
    store.apply(&tombstone("nobody", "t", 0));
    store.apply(&tombstone("g", "t", 1));
    assert!(!store.has_offsets("g"));
    assert_eq!(store.groups().count(), 0);
    // A commit after the tombstone brings it back, as on replay.
    store.apply(&commit("g", "t", 0, offset(12, 2)));
    assert_eq!(store.fetch("g", "t", 0), Some(&offset(12, 2)));
}

#[test]
fn fetch_group_is_sorted_by_topic_then_partition() {
    let mut store = OffsetStore::new();
    for (topic, partition) in [("b", 2), ("a", 10), ("b", 0), ("a", 2), ("a", -1)] {
        store.apply(&commit(
            "g",
            topic,
            partition,
            offset(i64::from(partition), 0),
        ));
    }
    store.apply(&commit("other", "a", 0, offset(0, 0)));
    let got: Vec<(&str, i32)> = store.fetch_group("g").map(|(t, p, _)| (t, p)).collect();
    assert_eq!(
        got,
        vec![("a", -1), ("a", 2), ("a", 10), ("b", 0), ("b", 2)]
    );
    assert_eq!(store.fetch_group("missing").count(), 0);
    assert_eq!(store.groups().collect::<Vec<_>>(), vec!["g", "other"]);
}

#[test]
fn group_metadata_records_are_kept_and_other_records_skipped() {
    let mut store = OffsetStore::new();
    store.apply(&CoordinatorRecord::GroupMetadata {
        group_id: "g".into(),
        value: Some(sample_group_metadata()),
    });
    store.apply(&CoordinatorRecord::Other {
        key_version: 3,
        key: Bytes::from_static(&[0, 3, 0, 1, b'g']),
        value: Some(Bytes::from_static(&[0, 0, 0, 0, 0, 1])),
    });
    assert_eq!(store.group_metadata("g"), Some(&sample_group_metadata()));
    assert!(!store.has_offsets("g"));
    store.apply(&group_tombstone("g"));
    assert_eq!(store.group_metadata("g"), None);
    assert_eq!(store.group_metadata_all().count(), 0);
}

#[test]
fn replaying_encoded_records_rebuilds_the_store() {
    let records = vec![
        commit("g", "t", 0, offset(1, 1)),
        CoordinatorRecord::GroupMetadata {
            group_id: "g".into(),
            value: Some(sample_group_metadata()),
        },
        commit("g", "t", 0, offset(2, 2)),
        commit("h", "t", 0, offset(3, 3)),
        tombstone("h", "t", 0),
    ];
    let mut live = OffsetStore::new();
    let mut log = Vec::new();
    for r in &records {
        live.apply(r);
        log.push(encode(r).unwrap());
    }
    let mut loaded = OffsetStore::new();
    for (k, v) in &log {
        loaded.apply(&decode(k, v.as_deref()).unwrap());
    }
    assert_eq!(loaded.fetch("g", "t", 0), Some(&offset(2, 2)));
    assert!(!loaded.has_offsets("h"));
    assert_eq!(loaded.group_metadata("g"), live.group_metadata("g"));
    assert_eq!(
        loaded.fetch_group("g").collect::<Vec<_>>(),
        live.fetch_group("g").collect::<Vec<_>>()
    );
}

#[test]
fn delete_group_records_tombstone_every_offset_then_the_metadata() {
    let mut store = OffsetStore::new();
    store.apply(&commit("g", "b", 1, offset(1, 0)));
    store.apply(&commit("g", "a", 0, offset(1, 0)));
    store.apply(&commit("keep", "a", 0, offset(1, 0)));
    store.apply(&CoordinatorRecord::GroupMetadata {
        group_id: "g".into(),
        value: Some(empty_group_metadata()),
    });
    let records = store.delete_group_records("g");
    assert_eq!(
        records,
        vec![
            tombstone("g", "a", 0),
            tombstone("g", "b", 1),
            group_tombstone("g")
        ]
    );
    for r in &records {
        store.apply(r);
    }
    assert!(!store.has_offsets("g"));
    assert_eq!(store.group_metadata("g"), None);
    assert!(store.has_offsets("keep"));
    // A group with offsets only: no GroupMetadata tombstone.
    assert_eq!(
        store.delete_group_records("keep"),
        vec![tombstone("keep", "a", 0)]
    );
    assert_eq!(store.delete_group_records("missing"), vec![]);
}

#[test]
fn delete_partition_records_only_for_partitions_with_offsets() {
    let mut store = OffsetStore::new();
    store.apply(&commit("g", "t", 0, offset(1, 0)));
    store.apply(&commit("g", "t", 2, offset(1, 0)));
    store.apply(&commit("g", "u", 1, offset(1, 0)));
    assert_eq!(
        store.delete_partition_records("g", "t", &[2, 1, 0, 2]),
        vec![tombstone("g", "t", 0), tombstone("g", "t", 2)]
    );
    assert_eq!(store.delete_partition_records("g", "v", &[0]), vec![]);
    assert_eq!(store.delete_partition_records("h", "t", &[0]), vec![]);
}

// ---- expiration ----

const RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;

fn store_with(group_id: &str, offsets: &[(&str, i32, OffsetAndMetadata)]) -> OffsetStore {
    let mut store = OffsetStore::new();
    for (topic, partition, o) in offsets {
        store.apply(&commit(group_id, topic, *partition, o.clone()));
    }
    store
}

fn topics(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn empty_classic_group_offsets_expire_exactly_at_the_boundary() {
    let store = store_with("g", &[("t", 0, offset(1, 1_000))]);
    let state = |_: &str| GroupExpiryState::ClassicEmpty {
        since_ms: Some(2_000),
    };
    let before = store.expired_records(2_000 + RETENTION_MS - 1, RETENTION_MS, state);
    assert_eq!(before, OffsetExpiration::default());
    let at = store.expired_records(2_000 + RETENTION_MS, RETENTION_MS, state);
    assert_eq!(
        at.records,
        vec![tombstone("g", "t", 0), group_tombstone("g")]
    );
    assert_eq!(at.deleted_groups, vec!["g".to_string()]);
}

#[test]
fn empty_classic_group_counts_from_when_it_became_empty_not_from_the_commit() {
    // Kafka's base timestamp for an Empty classic group is its current state
    // timestamp even when an offset was committed (by an admin) later.
    let store = store_with("g", &[("t", 0, offset(1, 50_000))]);
    let state = |_: &str| GroupExpiryState::ClassicEmpty {
        since_ms: Some(10_000),
    };
    let out = store.expired_records(10_000 + RETENTION_MS, RETENTION_MS, state);
    assert_eq!(out.records[0], tombstone("g", "t", 0));
    // Without a state timestamp (old metadata), the commit time is used.
    let state = |_: &str| GroupExpiryState::ClassicEmpty { since_ms: None };
    assert!(store
        .expired_records(10_000 + RETENTION_MS, RETENTION_MS, state)
        .records
        .is_empty());
    assert_eq!(
        store
            .expired_records(50_000 + RETENTION_MS, RETENTION_MS, state)
            .records[0],
        tombstone("g", "t", 0)
    );
}

#[test]
fn explicit_expire_timestamp_wins_over_retention() {
    let mut early = offset(1, 0);
    early.expire_timestamp_ms = Some(100);
    let mut late = offset(1, 0);
    late.expire_timestamp_ms = Some(10 * RETENTION_MS);
    let store = store_with("g", &[("t", 0, early), ("t", 1, late)]);
    let state = |_: &str| GroupExpiryState::ClassicSimple;
    // At 100 the first expires although retention has not passed.
    assert_eq!(
        store.expired_records(100, RETENTION_MS, state).records,
        vec![tombstone("g", "t", 0)]
    );
    assert!(store
        .expired_records(99, RETENTION_MS, state)
        .records
        .is_empty());
    // Long after retention, the second is kept until its own timestamp.
    let out = store.expired_records(5 * RETENTION_MS, RETENTION_MS, state);
    assert_eq!(out.records, vec![tombstone("g", "t", 0)]);
    assert!(out.deleted_groups.is_empty(), "an offset is left");
    let out = store.expired_records(10 * RETENTION_MS, RETENTION_MS, state);
    assert_eq!(
        out.records,
        vec![
            tombstone("g", "t", 0),
            tombstone("g", "t", 1),
            group_tombstone("g")
        ]
    );
}

#[test]
fn simple_group_offsets_expire_by_commit_time_one_by_one() {
    let store = store_with("g", &[("t", 0, offset(1, 0)), ("t", 1, offset(1, 1_000))]);
    let state = |_: &str| GroupExpiryState::ClassicSimple;
    let out = store.expired_records(RETENTION_MS, RETENTION_MS, state);
    assert_eq!(out.records, vec![tombstone("g", "t", 0)]);
    assert!(out.deleted_groups.is_empty());
}

#[test]
fn non_empty_classic_group_never_expires_without_known_subscriptions() {
    let store = store_with("g", &[("t", 0, offset(1, 0))]);
    let state = |_: &str| GroupExpiryState::ClassicActive {
        subscribed_topics: None,
    };
    assert_eq!(
        store.expired_records(i64::MAX, RETENTION_MS, state),
        OffsetExpiration::default()
    );
}

#[test]
fn stable_classic_group_expires_only_unsubscribed_topics_and_is_not_deleted() {
    let store = store_with("g", &[("old", 0, offset(1, 0)), ("t", 0, offset(1, 0))]);
    let state = |_: &str| GroupExpiryState::ClassicActive {
        subscribed_topics: Some(topics(&["t"])),
    };
    let out = store.expired_records(RETENTION_MS, RETENTION_MS, state);
    assert_eq!(out.records, vec![tombstone("g", "old", 0)]);
    assert!(out.deleted_groups.is_empty());
}

#[test]
fn consumer_group_expires_unsubscribed_topics_and_is_deleted_only_when_empty() {
    let store = store_with("g", &[("old", 0, offset(1, 0)), ("t", 0, offset(1, 0))]);
    let active = |_: &str| GroupExpiryState::Consumer {
        subscribed_topics: topics(&["t"]),
        is_empty: false,
    };
    let out = store.expired_records(RETENTION_MS, RETENTION_MS, active);
    assert_eq!(out.records, vec![tombstone("g", "old", 0)]);
    assert!(out.deleted_groups.is_empty());

    let empty = |_: &str| GroupExpiryState::Consumer {
        subscribed_topics: BTreeSet::new(),
        is_empty: true,
    };
    let out = store.expired_records(RETENTION_MS, RETENTION_MS, empty);
    // No GroupMetadata tombstone: a KIP-848 group has its own records.
    assert_eq!(
        out.records,
        vec![tombstone("g", "old", 0), tombstone("g", "t", 0)]
    );
    assert_eq!(out.deleted_groups, vec!["g".to_string()]);
}

#[test]
fn empty_classic_group_without_offsets_is_deleted_at_once() {
    let mut store = OffsetStore::new();
    store.apply(&CoordinatorRecord::GroupMetadata {
        group_id: "g".into(),
        value: Some(empty_group_metadata()),
    });
    store.apply(&CoordinatorRecord::GroupMetadata {
        group_id: "busy".into(),
        value: Some(sample_group_metadata()),
    });
    let out = store.expired_records(0, RETENTION_MS, |g| {
        if g == "g" {
            GroupExpiryState::ClassicEmpty { since_ms: Some(0) }
        } else {
            GroupExpiryState::ClassicActive {
                subscribed_topics: Some(BTreeSet::new()),
            }
        }
    });
    assert_eq!(out.records, vec![group_tombstone("g")]);
    assert_eq!(out.deleted_groups, vec!["g".to_string()]);
}

#[test]
fn applying_the_expiration_empties_the_store() {
    let mut store = store_with("g", &[("t", 0, offset(1, 0)), ("u", 3, offset(1, 0))]);
    store.apply(&CoordinatorRecord::GroupMetadata {
        group_id: "g".into(),
        value: Some(empty_group_metadata()),
    });
    let out = store.expired_records(RETENTION_MS, RETENTION_MS, |_| {
        GroupExpiryState::ClassicEmpty { since_ms: Some(0) }
    });
    for r in &out.records {
        store.apply(r);
    }
    assert_eq!(store.groups().count(), 0);
    assert_eq!(store.group_metadata_all().count(), 0);
    // Nothing is left to expire.
    assert_eq!(
        store.expired_records(i64::MAX, RETENTION_MS, |_| GroupExpiryState::ClassicSimple),
        OffsetExpiration::default()
    );
}

#[test]
fn extreme_timestamps_do_not_overflow() {
    let store = store_with("g", &[("t", 0, offset(1, i64::MIN))]);
    let out = store.expired_records(i64::MAX, RETENTION_MS, |_| GroupExpiryState::ClassicSimple);
    assert_eq!(out.records[0], tombstone("g", "t", 0));
    let store = store_with("g", &[("t", 0, offset(1, i64::MAX))]);
    assert!(store
        .expired_records(i64::MIN, RETENTION_MS, |_| GroupExpiryState::ClassicSimple)
        .records
        .is_empty());
}

// ---- partition_for ----

#[test]
fn partition_for_matches_java_string_hash_code_and_kafka_utils_abs() {
    // Expected values computed with Java 17: `Utils.abs(id.hashCode()) % n`.
    assert_eq!(partition_for("", 50), 0);
    assert_eq!(partition_for("a", 50), 47); // hashCode 97
    assert_eq!(partition_for("a", 7), 6);
    // hashCode -1906497762: Utils.abs gives 12; `& 0x7fffffff` would give 36.
    assert_eq!(partition_for("my-group", 50), 12);
    assert_eq!(partition_for("my-group", 7), 1);
    assert_eq!(partition_for("consumer-group-1", 50), 20); // 147483020
    assert_eq!(partition_for("consumer-group-1", 7), 6);
    // Non-ASCII: UTF-16 code units, a surrogate pair for the emoji.
    assert_eq!(partition_for("grüppe-ü", 50), 11); // 243491011
    assert_eq!(partition_for("组-😀", 50), 26); // 968593676
    assert_eq!(partition_for("组-😀", 7), 1);
    // hashCode is Integer.MIN_VALUE, which Utils.abs maps to 0.
    assert_eq!(partition_for("polygenelubricants", 50), 0);
    assert_eq!(partition_for("polygenelubricants", 7), 0);
    assert_eq!(partition_for("my-group", 1), 0);
    assert_eq!(partition_for("my-group", 0), 0);
}
