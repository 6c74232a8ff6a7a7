//! DescribeLogDirs (key 35): `kafka-log-dirs.sh --describe`, Admin
//! `describeLogDirs` / `describeReplicaLogDirs` (Cruise Control, Strimzi
//! and UIs read partition sizes here).
//!
//! As Kafka's `ReplicaManager.describeLogDirs`: this broker's log
//! directory (one: the first of `log.dirs`) as an absolute path, each
//! replica hosted there with its size in bytes and its offset lag (the high
//! watermark less the log end offset, at least 0; there are no future
//! replicas), and from v4 the file system's total and usable bytes. An
//! offline directory answers KAFKA_STORAGE_ERROR with no replicas. Needs
//! DESCRIBE on the cluster: without it the answer is
//! CLUSTER_AUTHORIZATION_FAILED (v3+) and no directories.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::Broker;

pub fn handle(
    broker: &Broker,
    version: i16,
    req: DescribeLogDirsRequest,
    allowed: bool,
) -> DescribeLogDirsResponse {
    let mut resp = DescribeLogDirsResponse::default();
    if !allowed {
        if version >= 3 {
            resp.error_code = ResponseError::ClusterAuthorizationFailed.code();
        }
        return resp;
    }
    let dir = broker.config.data_dir();
    let shown = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
    let mut result = DescribeLogDirsResult::default();
    result.log_dir = str_bytes(shown.display().to_string());
    if version >= 4 {
        // -1, as Kafka, when the file system cannot be asked.
        (result.total_bytes, result.usable_bytes) = match rustix::fs::statvfs(dir) {
            Ok(s) => (
                (s.f_blocks.saturating_mul(s.f_frsize)).min(i64::MAX as u64) as i64,
                (s.f_bavail.saturating_mul(s.f_frsize)).min(i64::MAX as u64) as i64,
            ),
            Err(_) => (-1, -1),
        };
    }
    if broker.replicas.log_dir_failure().is_offline() {
        result.error_code = ResponseError::KafkaStorageError.code();
        resp.results.push(result);
        return resp;
    }
    // `None`: every replica; else only those asked for (unknown ones are
    // simply not listed, as in Kafka).
    let wanted: Option<HashSet<(String, i32)>> = req.topics.map(|ts| {
        ts.into_iter()
            .flat_map(|t| {
                let name = t.topic.0.to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect()
    });
    let mut topics: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for (tp, part) in broker.replicas.all() {
        let key = (tp.topic.to_string(), tp.partition);
        if wanted.as_ref().is_some_and(|w| !w.contains(&key)) {
            continue;
        }
        let (size, lag) = {
            let p = part.lock().expect("poisoned");
            let lag = (p.high_watermark().0 - p.log_end_offset().0).max(0);
            (p.size_bytes(), lag)
        };
        let mut d = DescribeLogDirsPartition::default();
        d.partition_index = tp.partition;
        d.partition_size = size.min(i64::MAX as u64) as i64;
        d.offset_lag = lag;
        topics.entry(key.0).or_default().push(d);
    }
    for (name, mut partitions) in topics {
        partitions.sort_by_key(|p| p.partition_index);
        let mut t = DescribeLogDirsTopic::default();
        t.name = TopicName(str_bytes(name));
        t.partitions = partitions;
        result.topics.push(t);
    }
    resp.results.push(result);
    resp
}
