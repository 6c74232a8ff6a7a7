//! OffsetCommit (key 8): a group stores its consumers' positions. Versions
//! 0-1 are gone in Kafka 4; v2-4 carry a retention time, v6+ leader epochs,
//! v7+ the static instance id, v9+ report an unknown group as such.

use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::{OffsetCommitRequest, OffsetCommitResponse};
use kafka_protocol::ResponseError;

use crate::broker::{now_ms, Broker};
use crate::coordinator::{CommitError, CommitPartition};
use crate::group::offsets::OffsetAndMetadata;
use crate::group::{GenerationId, GroupInstanceId, MemberId};

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let now = now_ms();
    let image = broker.metadata.image();
    // Kafka answers partitions of unknown topics before asking the group.
    let mut codes: Vec<Vec<Option<i16>>> = Vec::with_capacity(req.topics.len());
    let mut commits = Vec::new();
    for t in &req.topics {
        let partitions = image
            .topics
            .get(t.name.0.as_str())
            .map(|t| t.partitions.len() as i32);
        let mut topic_codes = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            if partitions.is_none_or(|n| p.partition_index < 0 || p.partition_index >= n) {
                topic_codes.push(Some(ResponseError::UnknownTopicOrPartition.code()));
                continue;
            }
            topic_codes.push(None);
            let expire_timestamp_ms = if (2..=4).contains(&version) && req.retention_time_ms != -1 {
                Some(now.saturating_add(req.retention_time_ms))
            } else {
                None
            };
            commits.push(CommitPartition {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: OffsetAndMetadata {
                    committed_offset: p.committed_offset,
                    committed_leader_epoch: (version >= 6 && p.committed_leader_epoch >= 0)
                        .then_some(p.committed_leader_epoch),
                    metadata: p
                        .committed_metadata
                        .as_ref()
                        .map(|m| m.to_string())
                        .unwrap_or_default(),
                    commit_timestamp_ms: now,
                    expire_timestamp_ms,
                    // OffsetCommit v10 (topic ids) is not served yet.
                    topic_id: None,
                },
            });
        }
        codes.push(topic_codes);
    }
    let outcome = if commits.is_empty() {
        Ok((Vec::new(), None))
    } else {
        broker
            .groups
            .commit_offsets(
                &req.group_id.0,
                &MemberId(req.member_id.to_string()),
                req.group_instance_id
                    .as_ref()
                    .map(|i| GroupInstanceId(i.to_string()))
                    .as_ref(),
                GenerationId(req.generation_id_or_member_epoch),
                version,
                commits,
            )
            .await
    };
    // The commit is acked when every in-sync replica has it; a wait that
    // fails turns every stored partition into the group error.
    let results = match outcome {
        Ok((results, Some(pending))) => {
            let timeout = std::time::Duration::from_millis(broker.config.offsets_commit_timeout_ms);
            match pending.wait(timeout).await {
                Ok(()) => Ok(results),
                Err(e) => {
                    tracing::warn!(group = %req.group_id.0, error = %e, "offset commit not replicated");
                    let code = e.group_error();
                    Ok(results
                        .into_iter()
                        .map(|r| r.and(Err(CommitError::Group(code))))
                        .collect())
                }
            }
        }
        Ok((results, None)) => Ok(results),
        Err(e) => Err(e),
    };
    let mut results = match results {
        Ok(r) => r
            .into_iter()
            .map(|r| match r {
                Ok(()) => 0,
                Err(CommitError::OffsetMetadataTooLarge) => {
                    ResponseError::OffsetMetadataTooLarge.code()
                }
                Err(CommitError::Group(e)) => e.code(),
            })
            .collect::<Vec<_>>()
            .into_iter(),
        Err(e) => {
            vec![e.code(); codes.iter().flatten().filter(|c| c.is_none()).count()].into_iter()
        }
    };
    let mut resp = OffsetCommitResponse::default();
    for (t, topic_codes) in req.topics.into_iter().zip(codes) {
        let mut rt = OffsetCommitResponseTopic::default();
        rt.name = t.name;
        rt.topic_id = t.topic_id;
        for (p, code) in t.partitions.into_iter().zip(topic_codes) {
            let mut rp = OffsetCommitResponsePartition::default();
            rp.partition_index = p.partition_index;
            rp.error_code = code.unwrap_or_else(|| results.next().unwrap_or_default());
            rt.partitions.push(rp);
        }
        resp.topics.push(rt);
    }
    resp
}
