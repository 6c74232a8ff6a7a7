//! DescribeProducers (key 61): the producers a partition replica knows,
//! with their epoch, last sequence and timestamp, the coordinator epoch of
//! their last marker and where their open transaction starts (Kafka's
//! `handleDescribeProducersRequest`). As in Kafka, any replica hosted here
//! answers from its own producer state (the admin client asks the leader
//! unless told a broker); a topic name that is not legal is
//! INVALID_TOPIC_EXCEPTION, a topic unknown to the metadata is
//! UNKNOWN_TOPIC_OR_PARTITION, and a partition of a known topic that has no
//! replica here is NOT_LEADER_OR_FOLLOWER.

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{validate_topic_name, Broker};
use crate::error::PartitionError;
use crate::partition::Partition;
use crate::types::TopicPartition;

pub fn handle(
    broker: &Broker,
    _version: i16,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let image = broker.metadata.image();
    let mut resp = DescribeProducersResponse::default();
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut t = TopicResponse::default();
        t.name = topic.name.clone();
        let topic_error = match validate_topic_name(&name) {
            Err(msg) => Some((ResponseError::InvalidTopicException.code(), Some(msg))),
            Ok(()) if !image.topics.contains_key(&name) => {
                Some((ResponseError::UnknownTopicOrPartition.code(), None))
            }
            Ok(()) => None,
        };
        for index in topic.partition_indexes {
            let mut p = PartitionResponse::default();
            p.partition_index = index;
            match &topic_error {
                Some((code, msg)) => {
                    p.error_code = *code;
                    p.error_message = msg.clone().map(str_bytes);
                }
                None => describe(broker, &TopicPartition::new(name.as_str(), index), &mut p),
            }
            t.partitions.push(p);
        }
        resp.topics.push(t);
    }
    resp
}

/// One partition of a known topic: its replica's producers, or why not.
fn describe(broker: &Broker, tp: &TopicPartition, p: &mut PartitionResponse) {
    let Some(part) = broker.replicas.get(tp) else {
        // Kafka's `getPartitionOrError`: a partition the metadata has but
        // this node does not host is NOT_LEADER_OR_FOLLOWER.
        let hosted_elsewhere = broker
            .metadata
            .image()
            .topics
            .get(&*tp.topic)
            .is_some_and(|t| tp.partition >= 0 && (tp.partition as usize) < t.partitions.len());
        p.error_code = if hosted_elsewhere {
            PartitionError::NotLeaderOrFollower.code()
        } else {
            PartitionError::UnknownTopicOrPartition.code()
        };
        return;
    };
    let part = part.lock().expect("poisoned");
    p.active_producers = producer_states(&part);
}

fn producer_states(part: &Partition) -> Vec<ProducerState> {
    part.active_producers()
        .map(|(id, e)| {
            let mut s = ProducerState::default();
            s.producer_id = kafka_protocol::messages::ProducerId(id.0);
            s.producer_epoch = i32::from(e.producer_epoch);
            s.last_sequence = e.last_seq();
            s.last_timestamp = e.last_timestamp_ms;
            s.coordinator_epoch = e.coordinator_epoch;
            s.current_txn_start_offset = e.current_txn_first_offset.map_or(-1, |o| o.0);
            s
        })
        .collect()
}
