//! CreateTopics (key 19), including validate-only and config overrides.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
use kafka_protocol::ResponseError;

use super::describe_configs::{SOURCE_DEFAULT, SOURCE_TOPIC};
use super::str_bytes;
use crate::broker::{Broker, NewTopic};
use crate::config::TopicConfigs;

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = req
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|n| !seen.insert(n.clone()))
        .collect();
    for topic in req.topics {
        let name = topic.name.0.to_string();
        let mut r = CreatableTopicResult::default();
        r.name = topic.name.clone();
        r.num_partitions = -1;
        r.replication_factor = -1;
        if duplicates.contains(&name) {
            r.error_code = ResponseError::InvalidRequest.code();
            r.error_message = Some(str_bytes(format!(
                "Create topics request from client contains multiple entries for topic {name}"
            )));
            resp.topics.push(r);
            continue;
        }
        let mut configs = BTreeMap::new();
        let mut null_value = None;
        for c in &topic.configs {
            match &c.value {
                Some(v) => {
                    configs.insert(c.name.to_string(), v.to_string());
                }
                None => null_value = Some(c.name.to_string()),
            }
        }
        if let Some(key) = null_value {
            r.error_code = ResponseError::InvalidConfig.code();
            r.error_message = Some(str_bytes(format!(
                "Null value not supported for topic configs: {key}"
            )));
            resp.topics.push(r);
            continue;
        }
        let new = NewTopic {
            name: name.clone(),
            num_partitions: topic.num_partitions,
            replication_factor: topic.replication_factor,
            assignments: topic
                .assignments
                .iter()
                .map(|a| {
                    (
                        a.partition_index,
                        a.broker_ids.iter().map(|b| b.0).collect(),
                    )
                })
                .collect(),
            configs: configs.clone(),
        };
        match broker.create_topic(new, req.validate_only).await {
            Ok((topic_id, partitions)) => {
                r.topic_id = topic_id;
                r.num_partitions = partitions.len() as i32;
                r.replication_factor = partitions.first().map_or(0, |p| p.replicas.len() as i16);
                if version >= 5 {
                    let effective = TopicConfigs::resolve(&broker.config, &configs);
                    r.configs = Some(
                        effective
                            .iter()
                            .map(|(k, v)| {
                                let mut c = CreatableTopicConfigs::default();
                                c.name = str_bytes(k);
                                c.value = Some(str_bytes(v));
                                c.config_source = if configs.contains_key(k) {
                                    SOURCE_TOPIC
                                } else {
                                    SOURCE_DEFAULT
                                };
                                c
                            })
                            .collect(),
                    );
                }
                if !req.validate_only {
                    tracing::info!(topic = %name, partitions = r.num_partitions, "created topic");
                }
            }
            Err(e) => {
                r.error_code = e.code();
                r.error_message = Some(str_bytes(e.to_string()));
            }
        }
        resp.topics.push(r);
    }
    resp
}
