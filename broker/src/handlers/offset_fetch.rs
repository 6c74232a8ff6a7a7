//! OffsetFetch (key 9): a group's committed offsets. v8+ ask for several
//! groups at once; a null topic list asks for everything the group has.
//! v7+ may require stable offsets (read_committed consumers): a partition
//! with a transactional offset still pending is then UNSTABLE_OFFSET_COMMIT,
//! which the client retries.

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};

use super::str_bytes;
use crate::broker::Broker;
use crate::coordinator::UnstableOffsetCommit;
use crate::group::offsets::OffsetAndMetadata;
use crate::group::GroupError;
use kafka_protocol::ResponseError;

/// One partition's answer: offset, leader epoch, metadata, error code. A
/// partition without a commit is -1, -1, "" and no error, as in Kafka; an
/// unstable one is -1, -1, "" and UNSTABLE_OFFSET_COMMIT.
type Answer = (i32, i64, i32, String, i16);

fn answer(p: i32, o: Result<Option<OffsetAndMetadata>, UnstableOffsetCommit>) -> Answer {
    match o {
        Ok(Some(o)) => (
            p,
            o.committed_offset,
            o.committed_leader_epoch.unwrap_or(-1),
            o.metadata,
            0,
        ),
        Ok(None) => (p, -1, -1, String::new(), 0),
        Err(UnstableOffsetCommit) => (
            p,
            -1,
            -1,
            String::new(),
            ResponseError::UnstableOffsetCommit.code(),
        ),
    }
}

async fn fetch_group(
    broker: &Broker,
    group_id: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> Result<Vec<(String, Vec<Answer>)>, GroupError> {
    match topics {
        Some(topics) => {
            let wanted: Vec<(String, i32)> = topics
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |&p| (t.clone(), p)))
                .collect();
            let mut found = broker
                .groups
                .fetch_offsets(group_id, &wanted, require_stable)
                .await?
                .into_iter();
            Ok(topics
                .into_iter()
                .map(|(topic, partitions)| {
                    let answers = partitions
                        .into_iter()
                        .map(|p| answer(p, found.next().unwrap_or(Ok(None))))
                        .collect();
                    (topic, answers)
                })
                .collect())
        }
        None => {
            let mut out: Vec<(String, Vec<Answer>)> = Vec::new();
            for (topic, p, o) in broker
                .groups
                .fetch_all_offsets(group_id, require_stable)
                .await?
            {
                let answer = answer(p, o.map(Some));
                match out.last_mut() {
                    Some((t, answers)) if *t == topic => answers.push(answer),
                    _ => out.push((topic, vec![answer])),
                }
            }
            Ok(out)
        }
    }
}

pub async fn handle(broker: &Broker, version: i16, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        for g in req.groups {
            let topics = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let mut rg = OffsetFetchResponseGroup::default();
            if let Err(e) = broker.groups.check_coordinator(&g.group_id.0) {
                rg.error_code = e.code();
                rg.group_id = g.group_id;
                resp.groups.push(rg);
                continue;
            }
            if version >= 9 {
                let member = g.member_id.as_ref().map(|m| m.as_str());
                if let Err(e) = broker
                    .groups
                    .validate_offset_fetch(&g.group_id.0, member, g.member_epoch)
                    .await
                {
                    rg.error_code = e.code();
                    rg.group_id = g.group_id;
                    resp.groups.push(rg);
                    continue;
                }
            }
            let found = match fetch_group(broker, &g.group_id.0, topics, req.require_stable).await {
                Ok(found) => found,
                Err(e) => {
                    rg.error_code = e.code();
                    rg.group_id = g.group_id;
                    resp.groups.push(rg);
                    continue;
                }
            };
            for (topic, answers) in found {
                let mut rt = OffsetFetchResponseTopics::default();
                rt.name = TopicName(str_bytes(topic));
                rt.partitions = answers
                    .into_iter()
                    .map(|(p, offset, epoch, metadata, error_code)| {
                        let mut rp = OffsetFetchResponsePartitions::default();
                        rp.partition_index = p;
                        rp.committed_offset = offset;
                        rp.committed_leader_epoch = epoch;
                        rp.metadata = Some(str_bytes(metadata));
                        rp.error_code = error_code;
                        rp
                    })
                    .collect();
                rg.topics.push(rt);
            }
            rg.group_id = g.group_id;
            resp.groups.push(rg);
        }
        return resp;
    }
    if let Err(e) = broker.groups.check_coordinator(&req.group_id.0) {
        resp.error_code = e.code();
        return resp;
    }
    // v1 has a non-nullable topic list; v2+ null means "all".
    let topics = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    // Before v7 there is no require_stable; it decodes as false.
    let found = match fetch_group(broker, &req.group_id.0, topics, req.require_stable).await {
        Ok(found) => found,
        Err(e) => {
            resp.error_code = e.code();
            return resp;
        }
    };
    for (topic, answers) in found {
        let mut rt = OffsetFetchResponseTopic::default();
        rt.name = TopicName(str_bytes(topic));
        rt.partitions = answers
            .into_iter()
            .map(|(p, offset, epoch, metadata, error_code)| {
                let mut rp = OffsetFetchResponsePartition::default();
                rp.partition_index = p;
                rp.committed_offset = offset;
                rp.committed_leader_epoch = epoch;
                rp.metadata = Some(str_bytes(metadata));
                rp.error_code = error_code;
                rp
            })
            .collect();
        resp.topics.push(rt);
    }
    resp
}
