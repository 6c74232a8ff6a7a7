//! ListOffsets (key 2): earliest, latest, max timestamp, or by timestamp.
//! A read_committed client (`isolation_level` 1, from v2) gets the last
//! stable offset as latest, and timestamp lookups below it.

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::broker::Broker;
use crate::error::PartitionError;
use crate::partition::FetchLimit;
use crate::types::TopicPartition;

pub fn handle(broker: &Broker, version: i16, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut resp = ListOffsetsResponse::default();
    let replica_id = req.replica_id;
    let isolation_level = req.isolation_level;
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut t = ListOffsetsTopicResponse::default();
        t.name = topic.name.clone();
        for p in topic.partitions {
            let mut r = ListOffsetsPartitionResponse::default();
            r.partition_index = p.partition_index;
            r.timestamp = -1;
            r.offset = -1;
            r.leader_epoch = -1;
            let tp = TopicPartition::new(name.as_str(), p.partition_index);
            let outcome = match broker.replicas.get(&tp) {
                None => Err(PartitionError::UnknownTopicOrPartition),
                Some(part) => {
                    let part = part.lock().expect("poisoned");
                    let epoch = part.leader_epoch().0;
                    // Kafka's order: the epoch, then leadership (clients
                    // always ask the leader; only its high watermark is
                    // the committed end).
                    let check = part
                        .check_leader_epoch(p.current_leader_epoch)
                        .and_then(|()| {
                            if part.is_leader() {
                                Ok(())
                            } else {
                                Err(PartitionError::NotLeaderOrFollower)
                            }
                        });
                    if let Err(e) = check {
                        r.error_code = e.code();
                        t.partitions.push(r);
                        continue;
                    }
                    // The field exists from v4; older versions must leave it at -1.
                    if version >= 4 {
                        r.leader_epoch = epoch;
                    }
                    // A follower (replica id >= 0) asks for the leader's
                    // log end: it resets its fetch position there.
                    let limit = if replica_id.0 >= 0 {
                        FetchLimit::LogEnd
                    } else {
                        FetchLimit::for_isolation_level(isolation_level)
                    };
                    part.list_offset(p.timestamp, limit)
                }
            };
            match outcome {
                Ok(Some((offset, ts))) => {
                    r.offset = offset.0;
                    r.timestamp = ts;
                }
                Ok(None) => {}
                Err(e) => r.error_code = e.code(),
            }
            t.partitions.push(r);
        }
        resp.topics.push(t);
    }
    resp
}
