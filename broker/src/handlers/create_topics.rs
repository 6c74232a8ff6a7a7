//! CreateTopics (key 19), including validate-only and config overrides.
//!
//! As Kafka's controller (`ControllerApis.createTopics`,
//! `ReplicationControlManager.createTopics`): duplicate names are refused
//! one by one; then the request as a whole is refused with POLICY_VIOLATION
//! when its topics ask for more than 10,000 partitions, before anything is
//! placed; then every topic is validated and placed, and the request is
//! refused as a whole when the valid topics would write more than 10,000
//! metadata records. Only then is anything created (or, validate-only,
//! reported).

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse, TopicName};
use kafka_protocol::ResponseError;

use super::describe_configs::{source_code, SOURCE_DEFAULT, SOURCE_TOPIC};
use super::str_bytes;
use crate::broker::{
    count_operation_too_large, Broker, CreateTopicError, NewTopic, ValidatedTopic,
    MAX_PARTITIONS_PER_BATCH, MAX_RECORDS_PER_USER_OP, TOO_MANY_PARTITIONS, TOO_MANY_RECORDS,
};
use crate::config::TopicConfigs;
use crate::quota::usage::MutationQuota;

/// The metadata log's own topic, which no client may create.
const CLUSTER_METADATA_TOPIC: &str = "__cluster_metadata";

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: CreateTopicsRequest,
    quota: &MutationQuota,
) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    let all_names: Vec<TopicName> = req.topics.iter().map(|t| t.name.clone()).collect();
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> = req
        .topics
        .iter()
        .map(|t| t.name.0.to_string())
        .filter(|n| !seen.insert(n.clone()))
        .collect();
    let (topics, refused): (Vec<CreatableTopic>, Vec<CreatableTopic>) =
        req.topics.into_iter().partition(|t| {
            let name = t.name.0.as_str();
            !duplicates.contains(name) && name != CLUSTER_METADATA_TOPIC
        });
    let new_topics: Vec<NewTopic> = topics.iter().map(new_topic).collect();
    let requested = new_topics.iter().fold(0u64, |sum, t| {
        sum.saturating_add(t.requested_partitions(broker.config.num_partitions))
    });
    if requested > MAX_PARTITIONS_PER_BATCH {
        count_operation_too_large("CreateTopics");
        return refuse_all(all_names, TOO_MANY_PARTITIONS);
    }

    let mut outcomes: Vec<Result<ValidatedTopic, CreateTopicError>> = Vec::new();
    for (topic, new) in topics.iter().zip(new_topics) {
        let null_config = topic.configs.iter().find(|c| c.value.is_none());
        outcomes.push(match null_config {
            Some(c) => Err(CreateTopicError::NullConfig(c.name.to_string())),
            None => broker.validate_new_topic(new),
        });
    }
    let records = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .fold(0usize, |sum, t| sum.saturating_add(t.records()));
    if records > MAX_RECORDS_PER_USER_OP {
        count_operation_too_large("CreateTopics");
        return refuse_all(all_names, TOO_MANY_RECORDS);
    }

    for (topic, outcome) in topics.into_iter().zip(outcomes) {
        let mut r = CreatableTopicResult::default();
        r.name = topic.name.clone();
        r.num_partitions = -1;
        r.replication_factor = -1;
        // Kafka applies the mutation quota to a valid topic, validate-only
        // included, just before it would be created.
        let outcome = match outcome {
            Ok(valid) if quota.admit(broker, valid.partitions.len()).is_err() => {
                let (code, message) = MutationQuota::refusal();
                r.error_code = code;
                r.error_message = Some(str_bytes(message.to_string()));
                resp.topics.push(r);
                continue;
            }
            Ok(valid) => {
                r.topic_id = valid.topic_id;
                r.num_partitions = valid.partitions.len() as i32;
                r.replication_factor = valid
                    .partitions
                    .first()
                    .map_or(0, |p| p.replicas.len() as i16);
                let configs = valid.configs.clone();
                let name = valid.name.clone();
                let created = if req.validate_only {
                    Ok(())
                } else {
                    broker.create_validated(valid).await
                };
                created.map(|()| {
                    if !req.validate_only {
                        tracing::info!(topic = %name, partitions = r.num_partitions, "created topic");
                    }
                    configs
                })
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(configs) => {
                if version >= 5 {
                    r.configs = Some(effective_configs(broker, &configs));
                }
            }
            Err(e) => {
                r.topic_id = Default::default();
                r.num_partitions = -1;
                r.replication_factor = -1;
                r.error_code = e.code();
                r.error_message = Some(str_bytes(e.to_string()));
            }
        }
        resp.topics.push(r);
    }
    for name in refused_names(&refused) {
        let message = if name == CLUSTER_METADATA_TOPIC {
            format!("Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.")
        } else {
            "Duplicate topic name.".to_string()
        };
        resp.topics.push(error_result(
            TopicName(str_bytes(name)),
            ResponseError::InvalidRequest.code(),
            message,
        ));
    }
    resp.throttle_time_ms = quota.throttle_ms();
    resp
}

fn new_topic(topic: &CreatableTopic) -> NewTopic {
    NewTopic {
        name: topic.name.0.to_string(),
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
        configs: topic
            .configs
            .iter()
            .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn effective_configs(
    broker: &Broker,
    overrides: &BTreeMap<String, String>,
) -> Vec<CreatableTopicConfigs> {
    let dynamic = broker
        .metadata
        .image()
        .dynamic_broker_configs(broker.node_id());
    TopicConfigs::resolve_with(&broker.config, &dynamic, overrides)
        .iter()
        .map(|(k, v)| {
            let mut c = CreatableTopicConfigs::default();
            c.name = str_bytes(k);
            c.value = Some(str_bytes(v));
            c.config_source = if overrides.contains_key(k) {
                SOURCE_TOPIC
            } else {
                crate::config::topic_config(k)
                    .and_then(|e| e.broker_default_with(&broker.config, &dynamic))
                    .map_or(SOURCE_DEFAULT, |(_, s)| source_code(s))
            };
            c
        })
        .collect()
}

/// The names refused before validation (duplicates, the metadata topic),
/// each once, in request order.
fn refused_names(refused: &[CreatableTopic]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for t in refused {
        let name = t.name.0.to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Kafka's answer when the controller refuses the whole request
/// (`CreateTopicsRequest.getErrorResponse`): every entry of the request gets
/// the error.
fn refuse_all(names: Vec<TopicName>, message: &'static str) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    resp.topics = names
        .into_iter()
        .map(|name| {
            error_result(
                name,
                ResponseError::PolicyViolation.code(),
                message.to_string(),
            )
        })
        .collect();
    resp
}

fn error_result(name: TopicName, code: i16, message: String) -> CreatableTopicResult {
    let mut r = CreatableTopicResult::default();
    r.name = name;
    r.num_partitions = -1;
    r.replication_factor = -1;
    r.error_code = code;
    r.error_message = Some(str_bytes(message));
    r
}
