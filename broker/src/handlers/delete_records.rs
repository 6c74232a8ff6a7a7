//! DeleteRecords (key 21): advance a partition's log start offset.

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use crate::broker::Broker;
use crate::error::PartitionError;
use crate::types::TopicPartition;

pub fn handle(broker: &Broker, _version: i16, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut resp = DeleteRecordsResponse::default();
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut t = DeleteRecordsTopicResult::default();
        t.name = topic.name.clone();
        for p in topic.partitions {
            let mut r = DeleteRecordsPartitionResult::default();
            r.partition_index = p.partition_index;
            r.low_watermark = -1;
            let tp = TopicPartition::new(name.as_str(), p.partition_index);
            let result = match broker.replicas.get(&tp) {
                None => Err(PartitionError::UnknownTopicOrPartition),
                Some(part) => part
                    .lock()
                    .expect("poisoned")
                    .delete_records_before(p.offset),
            };
            match result {
                Ok(low) => r.low_watermark = low.0,
                Err(e) => r.error_code = e.code(),
            }
            t.partitions.push(r);
        }
        resp.topics.push(t);
    }
    resp
}
