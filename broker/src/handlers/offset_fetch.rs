//! OffsetFetch (key 9): a group's committed offsets. v8+ ask for several
//! groups at once; a null topic list asks for everything the group has.

use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{OffsetFetchRequest, OffsetFetchResponse, TopicName};

use super::str_bytes;
use crate::broker::Broker;
use crate::group::offsets::OffsetAndMetadata;
use crate::group::GroupError;

/// One partition's answer: offset, leader epoch, metadata. A partition
/// without a commit is -1, -1, "" and no error, as in Kafka.
type Answer = (i32, i64, i32, String);

async fn fetch_group(
    broker: &Broker,
    group_id: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> Result<Vec<(String, Vec<Answer>)>, GroupError> {
    let answer = |p: i32, o: Option<OffsetAndMetadata>| match o {
        Some(o) => (
            p,
            o.committed_offset,
            o.committed_leader_epoch.unwrap_or(-1),
            o.metadata,
        ),
        None => (p, -1, -1, String::new()),
    };
    match topics {
        Some(topics) => {
            let wanted: Vec<(String, i32)> = topics
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |&p| (t.clone(), p)))
                .collect();
            let mut found = broker
                .groups
                .committed(group_id, &wanted)
                .await?
                .into_iter();
            Ok(topics
                .into_iter()
                .map(|(topic, partitions)| {
                    let answers = partitions
                        .into_iter()
                        .map(|p| answer(p, found.next().flatten()))
                        .collect();
                    (topic, answers)
                })
                .collect())
        }
        None => {
            let mut out: Vec<(String, Vec<Answer>)> = Vec::new();
            for (topic, p, o) in broker.groups.committed_all(group_id).await? {
                let answer = answer(p, Some(o));
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
            let found = match fetch_group(broker, &g.group_id.0, topics).await {
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
                    .map(|(p, offset, epoch, metadata)| {
                        let mut rp = OffsetFetchResponsePartitions::default();
                        rp.partition_index = p;
                        rp.committed_offset = offset;
                        rp.committed_leader_epoch = epoch;
                        rp.metadata = Some(str_bytes(metadata));
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
    let found = match fetch_group(broker, &req.group_id.0, topics).await {
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
            .map(|(p, offset, epoch, metadata)| {
                let mut rp = OffsetFetchResponsePartition::default();
                rp.partition_index = p;
                rp.committed_offset = offset;
                rp.committed_leader_epoch = epoch;
                rp.metadata = Some(str_bytes(metadata));
                rp
            })
            .collect();
        resp.topics.push(rt);
    }
    resp
}
