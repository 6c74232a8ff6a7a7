//! CreatePartitions (key 37): grow a topic's partition count.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{metadata_error, Broker};
use crate::metadata::{MetadataCommand, PartitionImage};
use crate::types::{LeaderEpoch, NodeId};

pub async fn handle(
    broker: &Broker,
    _version: i16,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut resp = CreatePartitionsResponse::default();
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut r = CreatePartitionsTopicResult::default();
        r.name = topic.name.clone();
        let image = broker.metadata.image();
        let Some(current) = image.topics.get(&name) else {
            r.error_code = ResponseError::UnknownTopicOrPartition.code();
            r.error_message = Some(str_bytes(format!("The topic '{name}' does not exist.")));
            resp.results.push(r);
            continue;
        };
        let have = current.partitions.len() as i32;
        if topic.count <= have {
            r.error_code = ResponseError::InvalidPartitions.code();
            r.error_message = Some(str_bytes(format!(
                "Topic currently has {have} partitions, which is higher than the requested {}.",
                topic.count
            )));
            if topic.count == have {
                r.error_message = Some(str_bytes(format!("Topic already has {have} partitions.")));
            }
            resp.results.push(r);
            continue;
        }
        let brokers: Vec<NodeId> = if image.brokers.is_empty() {
            vec![broker.node_id()]
        } else {
            image.brokers.keys().copied().collect()
        };
        let rf = current.partitions.first().map_or(1, |p| p.replicas.len());
        let mut new = Vec::new();
        let mut bad = None;
        let mut bad_rf = None;
        let placed = broker.place_replicas(&image, have, topic.count - have, rf as i16);
        for (i, p) in (have..topic.count).enumerate() {
            let replicas: Vec<NodeId> = match &topic.assignments {
                Some(a) => match a.get(i) {
                    Some(ids) if !ids.broker_ids.is_empty() => {
                        ids.broker_ids.iter().map(|b| NodeId(b.0)).collect()
                    }
                    _ => {
                        bad = Some("Assignments must be given for every new partition".to_string());
                        break;
                    }
                },
                None => match &placed {
                    Ok(placed) => placed[i].clone(),
                    Err(e) => {
                        bad_rf = Some(e.to_string());
                        break;
                    }
                },
            };
            if let Some(u) = replicas.iter().find(|r| !brokers.contains(r)) {
                bad = Some(format!("Unknown broker {u} in the replica assignment"));
                break;
            }
            new.push(PartitionImage {
                partition: p,
                leader: replicas[0],
                isr: replicas.clone(),
                replicas,
                leader_epoch: LeaderEpoch(0),
                partition_epoch: 0,
            });
        }
        if let Some(why) = bad_rf {
            r.error_code = ResponseError::InvalidReplicationFactor.code();
            r.error_message = Some(str_bytes(why));
            resp.results.push(r);
            continue;
        }
        if let Some(why) = bad {
            r.error_code = ResponseError::InvalidReplicaAssignment.code();
            r.error_message = Some(str_bytes(why));
            resp.results.push(r);
            continue;
        }
        if !req.validate_only {
            match broker
                .metadata
                .propose(MetadataCommand::CreatePartitions {
                    name: name.clone(),
                    partitions: new,
                })
                .await
            {
                Ok(_) => {
                    if let Err(e) = broker.sync_replicas().await {
                        tracing::error!(topic = %name, error = %e, "opening new partitions failed");
                    }
                }
                Err(e) => {
                    r.error_code = metadata_error(&e).code();
                    r.error_message = Some(str_bytes(e.to_string()));
                }
            }
        }
        resp.results.push(r);
    }
    resp
}
