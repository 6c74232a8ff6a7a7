//! OffsetDelete (key 47): removes a group's committed offsets for
//! partitions it is not consuming.

use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::{OffsetDeleteRequest, OffsetDeleteResponse};
use kafka_protocol::ResponseError;

use crate::broker::Broker;
use crate::coordinator::DeleteOffsetsError;
use crate::group::error_code;

pub async fn handle(broker: &Broker, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let image = broker.metadata.image();
    let mut resp = OffsetDeleteResponse::default();
    let mut known = Vec::new();
    let mut unknown = Vec::new();
    for t in &req.topics {
        let count = image
            .topics
            .get(t.name.0.as_str())
            .map(|t| t.partitions.len() as i32);
        let (ok, bad): (Vec<i32>, Vec<i32>) = t
            .partitions
            .iter()
            .map(|p| p.partition_index)
            .partition(|&p| count.is_some_and(|n| p >= 0 && p < n));
        if !ok.is_empty() {
            known.push((t.name.0.to_string(), ok));
        }
        if !bad.is_empty() {
            unknown.push((t.name.clone(), bad));
        }
    }
    match broker.groups.delete_offsets(&req.group_id.0, &known).await {
        Err(DeleteOffsetsError::Group(e)) | Err(DeleteOffsetsError::Storage(e)) => {
            resp.error_code = e.code();
            return resp;
        }
        Ok(results) => {
            for (topic, partitions) in results {
                let mut rt = OffsetDeleteResponseTopic::default();
                rt.name = kafka_protocol::messages::TopicName(super::str_bytes(topic));
                rt.partitions = partitions
                    .into_iter()
                    .map(|(p, e)| {
                        let mut rp = OffsetDeleteResponsePartition::default();
                        rp.partition_index = p;
                        rp.error_code = error_code(e);
                        rp
                    })
                    .collect();
                resp.topics.push(rt);
            }
        }
    }
    for (name, partitions) in unknown {
        let mut rt = OffsetDeleteResponseTopic::default();
        rt.name = name;
        rt.partitions = partitions
            .into_iter()
            .map(|p| {
                let mut rp = OffsetDeleteResponsePartition::default();
                rp.partition_index = p;
                rp.error_code = ResponseError::UnknownTopicOrPartition.code();
                rp
            })
            .collect();
        resp.topics.push(rt);
    }
    resp
}
