//! DeleteTopics (key 20), by name (v1-5) or by name or id (v6).

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{DeleteTopicsRequest, DeleteTopicsResponse, TopicName};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{metadata_error, Broker};
use crate::metadata::MetadataCommand;
use crate::quota::usage::MutationQuota;

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: DeleteTopicsRequest,
    quota: &MutationQuota,
) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    let targets: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    for (name, id) in targets {
        let mut r = DeletableTopicResult::default();
        r.topic_id = id;
        let image = broker.metadata.image();
        let found = match &name {
            Some(n) => image.topics.get(n).cloned(),
            None => image.topic_by_id(id).cloned(),
        };
        r.name = name.clone().map(|n| TopicName(str_bytes(n)));
        let Some(topic) = found else {
            r.error_code = if name.is_some() {
                ResponseError::UnknownTopicOrPartition
            } else {
                ResponseError::UnknownTopicId
            }
            .code();
            resp.responses.push(r);
            continue;
        };
        r.name = Some(TopicName(str_bytes(topic.name.clone())));
        r.topic_id = topic.topic_id;
        if quota.admit(broker, topic.partitions.len()).is_err() {
            let (code, message) = MutationQuota::refusal();
            r.error_code = code;
            r.error_message = Some(str_bytes(message.to_string()));
            resp.responses.push(r);
            continue;
        }
        match broker
            .metadata
            .propose(MetadataCommand::DeleteTopic {
                name: topic.name.clone(),
            })
            .await
        {
            Ok(_) => {
                if let Err(e) = broker.sync_replicas().await {
                    tracing::error!(topic = %topic.name, error = %e, "deleting partitions failed");
                }
                tracing::info!(topic = %topic.name, "deleted topic");
                // Kafka's onPartitionsDeleted: committed offsets of a deleted
                // topic go with it, so a topic re-created under the same name
                // does not inherit positions.
                broker.groups.on_topic_deleted(&topic.name).await;
            }
            Err(e) => {
                r.error_code = metadata_error(&e).code();
                r.error_message = Some(str_bytes(e.to_string()));
            }
        }
        resp.responses.push(r);
    }
    resp.throttle_time_ms = quota.throttle_ms();
    resp
}
