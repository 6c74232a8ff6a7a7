//! AlterConfigs (key 33) and IncrementalAlterConfigs (key 44) for topics,
//! groups and brokers.
//!
//! Both compute a resource's new set of overrides from the current image,
//! check it (a topic's like CreateTopics does, a group's as Kafka's
//! `GroupConfig` does) and commit the difference through the metadata
//! quorum; the replica manager then hands a topic's new effective configs to
//! its partitions, and a group's coordinator reads them at its next
//! heartbeat. AlterConfigs replaces the whole set (keys not named are reset
//! to the broker default), IncrementalAlterConfigs edits key by key. On a
//! BROKER resource (`""` for every broker, or a node id) the dynamic broker
//! configs are the topic configs' broker keys, applied live; every other
//! broker key is static (server.properties) and refused with
//! INVALID_REQUEST, as Kafka refuses a key it cannot change while running.

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResourceResponse;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{metadata_error, Broker};
use crate::config::{TopicConfigs, TOPIC_CONFIGS};
use crate::metadata::MetadataCommand;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// Why one resource's change was refused: the Kafka error and its message.
struct Refusal(ResponseError, String);

impl Refusal {
    fn invalid_request(msg: impl Into<String>) -> Self {
        Refusal(ResponseError::InvalidRequest, msg.into())
    }
    fn invalid_config(msg: impl Into<String>) -> Self {
        Refusal(ResponseError::InvalidConfig, msg.into())
    }
}

/// One requested edit, after decoding.
enum Edit {
    Set(String, String),
    Delete(String),
    Append(String, String),
    Subtract(String, String),
}

pub async fn handle_alter(
    broker: &Broker,
    _version: i16,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let duplicates = duplicate_resources(
        req.resources
            .iter()
            .map(|r| (r.resource_type, &r.resource_name)),
    );
    let mut resp = AlterConfigsResponse::default();
    for resource in req.resources {
        let outcome =
            if duplicates.contains(&(resource.resource_type, resource.resource_name.to_string())) {
                Err(Refusal::invalid_request(format!(
                    "Duplicate resource {}",
                    resource.resource_name
                )))
            } else {
                let name = resource.resource_name.to_string();
                let mut values = BTreeMap::new();
                let mut refusal = None;
                for c in &resource.configs {
                    match &c.value {
                        Some(v) => {
                            if values.insert(c.name.to_string(), v.to_string()).is_some() {
                                refusal = Some(Refusal::invalid_request(format!(
                                    "Duplicate config key {}",
                                    c.name
                                )));
                            }
                        }
                        None => {
                            refusal = Some(Refusal::invalid_request(format!(
                                "Null value not supported for : {}",
                                c.name
                            )))
                        }
                    }
                }
                match refusal {
                    Some(r) => Err(r),
                    None => {
                        apply(
                            broker,
                            resource.resource_type,
                            &name,
                            req.validate_only,
                            |_| Ok(values),
                        )
                        .await
                    }
                }
            };
        let mut r = AlterConfigsResourceResponse::default();
        r.resource_type = resource.resource_type;
        r.resource_name = resource.resource_name;
        if let Err(Refusal(code, msg)) = outcome {
            r.error_code = code.code();
            r.error_message = Some(str_bytes(msg));
        }
        resp.responses.push(r);
    }
    resp
}

pub async fn handle_incremental(
    broker: &Broker,
    _version: i16,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let duplicates = duplicate_resources(
        req.resources
            .iter()
            .map(|r| (r.resource_type, &r.resource_name)),
    );
    let mut resp = IncrementalAlterConfigsResponse::default();
    for resource in req.resources {
        let name = resource.resource_name.to_string();
        let outcome = if duplicates.contains(&(resource.resource_type, name.clone())) {
            Err(Refusal::invalid_request(format!(
                "Duplicate resource {name}"
            )))
        } else {
            match decode_edits(&resource.configs) {
                Err(r) => Err(r),
                Ok(edits) => {
                    apply(
                        broker,
                        resource.resource_type,
                        &name,
                        req.validate_only,
                        |current| edit(broker, resource.resource_type, current, edits),
                    )
                    .await
                }
            }
        };
        let mut r = IncrementalResourceResponse::default();
        r.resource_type = resource.resource_type;
        r.resource_name = resource.resource_name;
        if let Err(Refusal(code, msg)) = outcome {
            r.error_code = code.code();
            r.error_message = Some(str_bytes(msg));
        }
        resp.responses.push(r);
    }
    resp
}

fn duplicate_resources<'a>(
    resources: impl Iterator<Item = (i8, &'a StrBytes)>,
) -> HashSet<(i8, String)> {
    let mut seen = HashSet::new();
    resources
        .map(|(t, n)| (t, n.to_string()))
        .filter(|k| !seen.insert(k.clone()))
        .collect()
}

fn decode_edits(
    configs: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
) -> Result<Vec<Edit>, Refusal> {
    let mut names = HashSet::new();
    let mut edits = Vec::with_capacity(configs.len());
    for c in configs {
        let name = c.name.to_string();
        if !names.insert(name.clone()) {
            return Err(Refusal::invalid_request(format!(
                "Error due to duplicate config keys: {name}"
            )));
        }
        let value = c.value.as_ref().map(|v| v.to_string());
        let needs_value = |value: Option<String>| {
            value.ok_or_else(|| {
                Refusal::invalid_request(format!("Null value not supported for : {name}"))
            })
        };
        edits.push(match c.config_operation {
            OP_SET => Edit::Set(name.clone(), needs_value(value)?),
            OP_DELETE => Edit::Delete(name),
            OP_APPEND => Edit::Append(name.clone(), needs_value(value)?),
            OP_SUBTRACT => Edit::Subtract(name.clone(), needs_value(value)?),
            other => {
                return Err(Refusal::invalid_request(format!(
                    "Unknown alter config operation {other} for {name}"
                )))
            }
        });
    }
    Ok(edits)
}

/// Applies incremental edits to a topic's current overrides. APPEND and
/// SUBTRACT work on list configs and start from the effective value (the
/// broker default when the topic has no override), as Kafka's do.
fn edit(
    broker: &Broker,
    resource_type: i8,
    current: &BTreeMap<String, String>,
    edits: Vec<Edit>,
) -> Result<BTreeMap<String, String>, Refusal> {
    let mut next = current.clone();
    for e in edits {
        match e {
            Edit::Set(k, v) => {
                next.insert(k, v);
            }
            // Kafka ignores deleting a key that was never set, known or not.
            Edit::Delete(k) => {
                next.remove(&k);
            }
            Edit::Append(k, _) | Edit::Subtract(k, _)
                if resource_type == RESOURCE_GROUP || !is_list(resource_type, &k) =>
            {
                known_key(resource_type, &k)?;
                return Err(Refusal::invalid_config(format!(
                    "Config value append/subtract is not allowed for config key: {k}"
                )));
            }
            Edit::Append(k, v) => {
                let mut items = list_value(broker, resource_type, current, &k);
                for item in split_list(&v) {
                    if !items.contains(&item) {
                        items.push(item);
                    }
                }
                next.insert(k, items.join(","));
            }
            Edit::Subtract(k, v) => {
                let remove = split_list(&v);
                let items: Vec<String> = list_value(broker, resource_type, current, &k)
                    .into_iter()
                    .filter(|i| !remove.contains(i))
                    .collect();
                next.insert(k, items.join(","));
            }
        }
    }
    Ok(next)
}

fn known_key(resource_type: i8, key: &str) -> Result<(), Refusal> {
    if resource_type == RESOURCE_BROKER {
        return crate::config::dynamic_broker_key(key)
            .map(|_| ())
            .ok_or_else(|| not_dynamic(key));
    }
    if resource_type == RESOURCE_GROUP {
        return if crate::config::group::keys().any(|k| k == key) {
            Ok(())
        } else {
            Err(Refusal::invalid_config(format!(
                "Unknown group config name: {key}"
            )))
        };
    }
    if TOPIC_CONFIGS.iter().any(|e| e.name == key) {
        Ok(())
    } else {
        Err(Refusal::invalid_config(format!(
            "Unknown topic config name: {key}"
        )))
    }
}

fn is_list(resource_type: i8, key: &str) -> bool {
    let entry = if resource_type == RESOURCE_BROKER {
        crate::config::dynamic_broker_key(key)
    } else {
        crate::config::topic_config(key)
    };
    entry.is_some_and(|e| e.config_type() == 7)
}

/// Kafka's refusal of a broker config it cannot change while running.
fn not_dynamic(key: &str) -> Refusal {
    Refusal::invalid_request(format!(
        "Cannot update these configs dynamically: Set({key})"
    ))
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn list_value(
    broker: &Broker,
    resource_type: i8,
    current: &BTreeMap<String, String>,
    key: &str,
) -> Vec<String> {
    if resource_type == RESOURCE_BROKER {
        // A dynamic broker key not set at this level starts from the static value.
        return match current.get(key) {
            Some(v) => split_list(v),
            None => crate::config::dynamic_broker_key(key)
                .and_then(|e| e.broker_default(&broker.config))
                .map(|v| split_list(&v))
                .unwrap_or_default(),
        };
    }
    match current.get(key) {
        Some(v) => split_list(v),
        None => split_list(
            TopicConfigs::resolve_with(
                &broker.config,
                &broker
                    .metadata
                    .image()
                    .dynamic_broker_configs(broker.node_id()),
                &BTreeMap::new(),
            )
            .get(key),
        ),
    }
}

/// What turns `current` into `next`: the keys to set (new or changed) and
/// the keys to delete; `None` when they are equal.
fn difference(
    current: &BTreeMap<String, String>,
    next: &BTreeMap<String, String>,
) -> Option<(BTreeMap<String, String>, Vec<String>)> {
    let set: BTreeMap<String, String> = next
        .iter()
        .filter(|(k, v)| current.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let delete: Vec<String> = current
        .keys()
        .filter(|k| !next.contains_key(*k))
        .cloned()
        .collect();
    (!set.is_empty() || !delete.is_empty()).then_some((set, delete))
}

/// Checks the resource, computes its new overrides with `change`, validates
/// them and, unless `validate_only`, commits the difference.
async fn apply(
    broker: &Broker,
    resource_type: i8,
    name: &str,
    validate_only: bool,
    change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, Refusal>,
) -> Result<(), Refusal> {
    match resource_type {
        RESOURCE_TOPIC => {}
        RESOURCE_GROUP => return apply_group(broker, name, validate_only, change).await,
        RESOURCE_BROKER => return apply_broker(broker, name, validate_only, change).await,
        other => {
            return Err(Refusal::invalid_request(format!(
                "Unsupported resource type {other}"
            )))
        }
    }
    let image = broker.metadata.image();
    let Some(topic) = image.topics.get(name) else {
        return Err(Refusal(
            ResponseError::UnknownTopicOrPartition,
            format!("The topic '{name}' does not exist."),
        ));
    };
    let next = change(&topic.configs)?;
    TopicConfigs::validate_overrides(
        &broker.config,
        &image.dynamic_broker_configs(broker.node_id()),
        next.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
    .map_err(|e| Refusal::invalid_config(e.to_string()))?;
    if validate_only {
        return Ok(());
    }
    let changed = propose_difference(broker, &topic.configs, &next, |set, delete| {
        MetadataCommand::AlterTopicConfigs {
            name: name.to_string(),
            set,
            delete,
        }
    })
    .await?;
    if changed {
        sync_replicas(broker).await?;
        tracing::info!(topic = %name, "altered topic configs");
    }
    Ok(())
}

/// Commits what turns `current` into `next` through the metadata quorum, as
/// the command `command` builds from the keys to set and to delete; nothing
/// when they are equal. True when something was committed.
async fn propose_difference(
    broker: &Broker,
    current: &BTreeMap<String, String>,
    next: &BTreeMap<String, String>,
    command: impl FnOnce(BTreeMap<String, String>, Vec<String>) -> MetadataCommand,
) -> Result<bool, Refusal> {
    let Some((set, delete)) = difference(current, next) else {
        return Ok(false);
    };
    broker
        .metadata
        .propose(command(set, delete))
        .await
        .map_err(|e| Refusal(metadata_error(&e), e.to_string()))?;
    Ok(true)
}

/// Hands the new image to this broker's partitions before answering, so
/// a produce right after the answer meets the new configs here.
async fn sync_replicas(broker: &Broker) -> Result<(), Refusal> {
    broker
        .sync_replicas()
        .await
        .map_err(|e| Refusal(ResponseError::UnknownServerError, e.to_string()))
}

/// Dynamic broker configs, for every broker (`""`) or one (its node id):
/// the broker keys of topic configs (Kafka's `DynamicLogConfig`), checked
/// with their topic config's rule and stored in the metadata quorum; every
/// broker's partitions take them from the next image, as a topic override
/// is taken. Any other key is refused as Kafka refuses a static one.
async fn apply_broker(
    broker: &Broker,
    name: &str,
    validate_only: bool,
    change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, Refusal>,
) -> Result<(), Refusal> {
    let image = broker.metadata.image();
    if !name.is_empty() {
        let known = name
            .parse::<i32>()
            .ok()
            .is_some_and(|id| image.brokers.contains_key(&crate::types::NodeId(id)));
        if !known {
            return Err(Refusal::invalid_request(format!(
                "Unexpected broker id {name}: no such broker is registered"
            )));
        }
    }
    let empty = BTreeMap::new();
    let current = image.broker_configs.get(name).unwrap_or(&empty);
    let next = change(current)?;
    for (k, v) in &next {
        crate::config::dynamic_broker_key(k).ok_or_else(|| not_dynamic(k))?;
        crate::config::check_dynamic_broker_config(k, v)
            .map_err(|e| Refusal::invalid_config(e.to_string()))?;
    }
    if !crate::metadata::liveness::all_support(&image, crate::metadata::FEATURE_BROKER_CONFIGS) {
        return Err(Refusal::invalid_request(
            "not every broker runs a version that applies dynamic broker configs yet: finish the upgrade first",
        ));
    }
    if validate_only {
        return Ok(());
    }
    let changed = propose_difference(broker, current, &next, |set, delete| {
        MetadataCommand::AlterBrokerConfigs {
            resource: name.to_string(),
            set,
            delete,
        }
    })
    .await?;
    if changed {
        sync_replicas(broker).await?;
        tracing::info!(
            resource = if name.is_empty() { "<default>" } else { name },
            "altered dynamic broker configs"
        );
    }
    Ok(())
}

/// A group's configs: checked as Kafka's `GroupConfig` checks them and
/// stored whether or not the group exists (a user sets them before its
/// consumers start).
async fn apply_group(
    broker: &Broker,
    name: &str,
    validate_only: bool,
    change: impl FnOnce(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, Refusal>,
) -> Result<(), Refusal> {
    if name.is_empty() {
        return Err(Refusal::invalid_request("Group name can't be empty"));
    }
    let image = broker.metadata.image();
    let empty = BTreeMap::new();
    let current = image.group_configs.get(name).unwrap_or(&empty);
    let next = change(current)?;
    crate::config::group::validate(&broker.config, &next).map_err(Refusal::invalid_config)?;
    if validate_only {
        return Ok(());
    }
    let changed = propose_difference(broker, current, &next, |set, delete| {
        MetadataCommand::AlterGroupConfigs {
            group: name.to_string(),
            set,
            delete,
        }
    })
    .await?;
    if changed {
        tracing::info!(group = %name, "altered group configs");
    }
    Ok(())
}
