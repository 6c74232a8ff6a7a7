//! DescribeQuorum (key 55): the metadata quorum's leader, term and voters,
//! what `kafka-metadata-quorum.sh describe --status` and Admin
//! `describeMetadataQuorum` print. Any node answers with the active
//! controller's (Raft leader's) view, asked over the controller listener as
//! a Kafka broker forwards the request; only if that fails does a follower
//! answer from its own view, with the others' log ends unknown (-1).

use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{BrokerId, DescribeQuorumRequest, DescribeQuorumResponse};
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::str_bytes;
use crate::broker::Broker;

/// Kafka's name for the metadata log, the only topic this API describes.
pub const METADATA_TOPIC: &str = "__cluster_metadata";

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    let mut resp = DescribeQuorumResponse::default();
    let info = broker.metadata.quorum_info().await;
    for topic in req.topics {
        let mut t = TopicData::default();
        t.topic_name = topic.topic_name.clone();
        for p in topic.partitions {
            let mut d = PartitionData::default();
            d.partition_index = p.partition_index;
            if topic.topic_name.0.as_str() != METADATA_TOPIC || p.partition_index != 0 {
                d.error_code = ResponseError::UnknownTopicOrPartition.code();
                if version >= 2 {
                    d.error_message = Some(str_bytes("Only __cluster_metadata-0 has a quorum"));
                }
                t.partitions.push(d);
                continue;
            }
            let Some(leader) = info.leader else {
                d.error_code = ResponseError::LeaderNotAvailable.code();
                d.leader_id = BrokerId(-1);
                t.partitions.push(d);
                continue;
            };
            d.leader_id = BrokerId(leader.0);
            d.leader_epoch = i32::try_from(info.term).unwrap_or(i32::MAX);
            d.high_watermark = info.high_watermark as i64;
            d.current_voters = info
                .voters
                .iter()
                .map(|v| {
                    let mut r = ReplicaState::default();
                    r.replica_id = BrokerId(v.node_id.0);
                    r.replica_directory_id = Uuid::nil();
                    r.log_end_offset = v.log_end_offset.map_or(-1, |o| o as i64);
                    r.last_fetch_timestamp = -1;
                    r.last_caught_up_timestamp = -1;
                    r
                })
                .collect();
            t.partitions.push(d);
        }
        resp.topics.push(t);
    }
    if version >= 2 {
        resp.nodes = info
            .voters
            .iter()
            .filter_map(|v| {
                let (host, port) = v.addr.rsplit_once(':')?;
                let mut l = Listener::default();
                l.name = str_bytes(
                    broker
                        .config
                        .controller_listener_names
                        .first()
                        .cloned()
                        .unwrap_or_else(|| "CONTROLLER".into()),
                );
                l.host = str_bytes(host.to_string());
                l.port = port.parse().ok()?;
                let mut n = Node::default();
                n.node_id = BrokerId(v.node_id.0);
                n.listeners = vec![l];
                Some(n)
            })
            .collect();
    }
    resp
}
