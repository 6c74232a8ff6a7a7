//! OffsetForLeaderEpoch (key 23): for each partition, the end offset of the
//! largest leader epoch <= the requested one, from the leader's epoch cache.
//! Followers call it before fetching, to find where their log diverges from
//! the leader's; consumers call it after a leader change to check that their
//! position is still on the leader's log (KIP-320).
//!
//! As Kafka (`ReplicaManager.lastOffsetForLeaderEpoch`), only the leader
//! answers, for replicas and consumers alike, and `current_leader_epoch` (-1:
//! not checked) fences callers whose view of the leadership is stale or
//! ahead of ours.

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use kafka_protocol::ResponseError;

use crate::broker::Broker;
use crate::types::{LeaderEpoch, TopicPartition};

pub fn handle(
    broker: &Broker,
    _version: i16,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let image = broker.metadata.image();
    let mut resp = OffsetForLeaderEpochResponse::default();
    for topic in req.topics {
        let name = topic.topic.0.to_string();
        let topic_image = image.topics.get(&name);
        let mut t = OffsetForLeaderTopicResult::default().with_topic(topic.topic.clone());
        for p in topic.partitions {
            let mut r = EpochEndOffset::default()
                .with_partition(p.partition)
                .with_leader_epoch(-1)
                .with_end_offset(-1);
            let pimg = topic_image
                .and_then(|ti| ti.partitions.iter().find(|x| x.partition == p.partition));
            let tp = TopicPartition::new(name.as_str(), p.partition);
            let error = match (pimg, broker.replicas.get(&tp)) {
                (None, _) => Some(ResponseError::UnknownTopicOrPartition),
                // In the image but not hosted here.
                (Some(_), None) => Some(ResponseError::NotLeaderOrFollower),
                (Some(_), Some(part)) => {
                    // Kafka's getLocalLog: the epoch check first, then
                    // leadership, both as this replica last applied them.
                    let part = part.lock().expect("poisoned");
                    match part.check_leader_epoch(p.current_leader_epoch) {
                        Err(e) => Some(
                            ResponseError::try_from_code(e.code())
                                .unwrap_or(ResponseError::UnknownServerError),
                        ),
                        Ok(()) if !part.is_leader() => Some(ResponseError::NotLeaderOrFollower),
                        Ok(()) => {
                            let (epoch, offset) =
                                part.end_offset_for_epoch(LeaderEpoch(p.leader_epoch));
                            r.leader_epoch = epoch.0;
                            r.end_offset = offset.0;
                            None
                        }
                    }
                }
            };
            if let Some(e) = error {
                r.error_code = e.code();
            }
            t.partitions.push(r);
        }
        resp.topics.push(t);
    }
    resp
}
