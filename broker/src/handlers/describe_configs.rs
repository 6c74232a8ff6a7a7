//! DescribeConfigs (key 32): topic configs (overrides and defaults, with
//! their sources) and this broker's configs, as Kafka reports them.

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::Broker;
use std::collections::BTreeMap;

use crate::config::{
    dynamic_broker_key, BrokerSource, DynamicBrokerConfigs, ServerConfig, TopicConfigEntry,
    TopicConfigs, TOPIC_CONFIGS,
};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;

pub const SOURCE_TOPIC: i8 = 1;
pub const SOURCE_DYNAMIC_BROKER: i8 = 2;
pub const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub const SOURCE_STATIC_BROKER: i8 = 4;
pub const SOURCE_DEFAULT: i8 = 5;
pub const SOURCE_GROUP: i8 = 8;

const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;

fn config_type(name: &str) -> i8 {
    match name {
        "cleanup.policy"
        | "log.cleanup.policy"
        | "listeners"
        | "advertised.listeners"
        | "log.dirs" => TYPE_LIST,
        "compression.type"
        | "message.timestamp.type"
        | "log.message.timestamp.type"
        | "metrics.listen.address" => TYPE_STRING,
        "unclean.leader.election.enable" | "auto.create.topics.enable" => TYPE_BOOLEAN,
        "index.interval.bytes"
        | "max.message.bytes"
        | "min.insync.replicas"
        | "segment.bytes"
        | "node.id"
        | "num.partitions"
        | "message.max.bytes"
        | "log.index.interval.bytes"
        | "log.segment.bytes"
        | "socket.request.max.bytes"
        | "fetch.max.bytes"
        | "queued.max.requests"
        | "max.connections"
        | "default.replication.factor" => TYPE_INT,
        _ => TYPE_LONG,
    }
}

/// The type DescribeConfigs reports for a group config key.
fn group_config_type(name: &str) -> i8 {
    match name {
        "share.auto.offset.reset"
        | "share.isolation.level"
        | "errors.deadletterqueue.topic.name" => TYPE_STRING,
        "share.renew.acknowledge.enable" | "errors.deadletterqueue.copy.record.enable" => {
            TYPE_BOOLEAN
        }
        _ => TYPE_INT,
    }
}

/// Every broker config we honour, with its effective value.
pub fn broker_configs(c: &ServerConfig) -> Vec<(&'static str, String)> {
    let listeners = |ls: &[crate::config::Listener]| {
        ls.iter()
            .map(|l| format!("{}://{}:{}", l.name, l.host, l.port))
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        ("node.id", c.node_id.0.to_string()),
        ("listeners", listeners(&c.listeners)),
        ("advertised.listeners", listeners(&c.advertised_listeners)),
        (
            "log.dirs",
            c.log_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        ("num.partitions", c.num_partitions.to_string()),
        (
            "default.replication.factor",
            c.default_replication_factor.to_string(),
        ),
        (
            "auto.create.topics.enable",
            c.auto_create_topics_enable.to_string(),
        ),
        ("log.retention.ms", c.log_retention_ms.to_string()),
        ("log.retention.bytes", c.log_retention_bytes.to_string()),
        ("log.segment.bytes", c.log_segment_bytes.to_string()),
        ("log.roll.ms", c.log_roll_ms.to_string()),
        (
            "log.index.interval.bytes",
            c.log_index_interval_bytes.to_string(),
        ),
        ("log.cleanup.policy", c.log_cleanup_policy.clone()),
        (
            "log.cleaner.delete.retention.ms",
            c.log_cleaner_delete_retention_ms.to_string(),
        ),
        (
            "log.flush.interval.messages",
            if c.log_flush_interval_messages == u64::MAX {
                i64::MAX.to_string()
            } else {
                c.log_flush_interval_messages.to_string()
            },
        ),
        ("log.flush.interval.ms", c.log_flush_interval_ms.to_string()),
        (
            "log.retention.check.interval.ms",
            c.log_retention_check_interval_ms.to_string(),
        ),
        (
            "log.message.timestamp.type",
            c.log_message_timestamp_type.clone(),
        ),
        (
            "log.message.timestamp.before.max.ms",
            c.log_message_timestamp_before_max_ms.to_string(),
        ),
        (
            "log.message.timestamp.after.max.ms",
            c.log_message_timestamp_after_max_ms.to_string(),
        ),
        ("message.max.bytes", c.message_max_bytes.to_string()),
        ("min.insync.replicas", c.min_insync_replicas.to_string()),
        (
            "socket.request.max.bytes",
            c.socket_request_max_bytes.to_string(),
        ),
        ("fetch.max.bytes", c.fetch_max_bytes.to_string()),
        ("queued.max.requests", c.queued_max_requests.to_string()),
        ("max.connections", c.max_connections.to_string()),
        (
            "metrics.listen.address",
            c.metrics_listen
                .map(|a| a.to_string())
                .unwrap_or_else(|| "none".into()),
        ),
    ]
}

fn entry(name: &str, value: String, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    let mut e = DescribeConfigsResourceResult::default();
    e.name = str_bytes(name);
    e.value = Some(str_bytes(value));
    e.config_source = source;
    e.read_only = read_only;
    e.config_type = config_type(name);
    e
}

fn wanted(keys: &Option<Vec<kafka_protocol::protocol::StrBytes>>, name: &str) -> bool {
    keys.as_ref()
        .is_none_or(|ks| ks.is_empty() || ks.iter().any(|k| &**k == name))
}

pub fn handle(
    broker: &Broker,
    _version: i16,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut resp = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut r = DescribeConfigsResult::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name.clone();
        match res.resource_type {
            RESOURCE_TOPIC => {
                let image = broker.metadata.image();
                let Some(topic) = image.topics.get(&*res.resource_name) else {
                    r.error_code = ResponseError::UnknownTopicOrPartition.code();
                    r.error_message = Some(str_bytes(format!(
                        "Topic '{}' does not exist.",
                        &*res.resource_name
                    )));
                    resp.results.push(r);
                    continue;
                };
                let dynamic = image.dynamic_broker_configs(broker.node_id());
                let effective =
                    TopicConfigs::resolve_with(&broker.config, &dynamic, &topic.configs);
                for e in TOPIC_CONFIGS.iter().filter(|e| !e.internal) {
                    if !wanted(&res.configuration_keys, e.name) {
                        continue;
                    }
                    let source = if topic.configs.contains_key(e.name) {
                        SOURCE_TOPIC
                    } else {
                        e.broker_default_with(&broker.config, &dynamic)
                            .map_or(SOURCE_DEFAULT, |(_, s)| source_code(s))
                    };
                    let mut c = entry(e.name, effective.get(e.name).to_string(), source, false);
                    c.config_type = e.config_type();
                    c.is_sensitive = e.sensitive;
                    c.documentation = Some(str_bytes(e.doc));
                    if req.include_synonyms {
                        c.synonyms =
                            topic_synonyms(e, &broker.config, &dynamic, topic.configs.get(e.name));
                    }
                    r.configs.push(c);
                }
            }
            RESOURCE_BROKER => {
                let name = &*res.resource_name;
                if !name.is_empty() && name != broker.node_id().0.to_string() {
                    r.error_code = ResponseError::InvalidRequest.code();
                    r.error_message = Some(str_bytes(format!(
                        "Unexpected broker id, expected {} or empty string, but received {name}",
                        broker.node_id()
                    )));
                    resp.results.push(r);
                    continue;
                }
                let image = broker.metadata.image();
                if name.is_empty() {
                    // The cluster-wide dynamic defaults alone, as Kafka
                    // answers for the default broker resource.
                    let empty = BTreeMap::new();
                    for (k, v) in image.broker_configs.get("").unwrap_or(&empty) {
                        if !wanted(&res.configuration_keys, k) {
                            continue;
                        }
                        let mut c = entry(k, v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER, false);
                        if let Some(e) = dynamic_broker_key(k) {
                            c.config_type = e.config_type();
                        }
                        if req.include_synonyms {
                            c.synonyms
                                .push(synonym(k, v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER));
                        }
                        r.configs.push(c);
                    }
                    resp.results.push(r);
                    continue;
                }
                let dynamic = image.dynamic_broker_configs(broker.node_id());
                let mut listed = Vec::new();
                for (k, v) in broker_configs(&broker.config) {
                    listed.push(k);
                    if !wanted(&res.configuration_keys, k) {
                        continue;
                    }
                    if let Some(e) = dynamic_broker_key(k) {
                        r.configs.push(dynamic_entry(
                            e,
                            &broker.config,
                            &dynamic,
                            req.include_synonyms,
                        ));
                        continue;
                    }
                    let source = if broker.config.explicit.contains_key(k) {
                        SOURCE_STATIC_BROKER
                    } else {
                        SOURCE_DEFAULT
                    };
                    let mut c = entry(k, v.clone(), source, true);
                    if req.include_synonyms {
                        c.synonyms.push(synonym(k, v, source));
                    }
                    r.configs.push(c);
                }
                // The dynamic keys the static list does not name.
                for e in TOPIC_CONFIGS.iter().filter(|e| !e.internal) {
                    let Some(&k) = e.synonyms.first() else {
                        continue;
                    };
                    if listed.contains(&k) || !wanted(&res.configuration_keys, k) {
                        continue;
                    }
                    r.configs.push(dynamic_entry(
                        e,
                        &broker.config,
                        &dynamic,
                        req.include_synonyms,
                    ));
                }
            }
            RESOURCE_GROUP => {
                // Every group has the defaults, whether or not it exists,
                // as in Kafka.
                let image = broker.metadata.image();
                let own = image.group_configs.get(&*res.resource_name);
                for (k, v, is_own) in crate::config::group::effective(&broker.config, own) {
                    if !wanted(&res.configuration_keys, k) {
                        continue;
                    }
                    let source = if is_own { SOURCE_GROUP } else { SOURCE_DEFAULT };
                    let mut c = entry(k, v.clone(), source, false);
                    c.config_type = group_config_type(k);
                    if req.include_synonyms {
                        c.synonyms.push(synonym(k, v, source));
                    }
                    r.configs.push(c);
                }
            }
            other => {
                r.error_code = ResponseError::InvalidRequest.code();
                r.error_message = Some(str_bytes(format!("Unsupported resource type {other}")));
            }
        }
        resp.results.push(r);
    }
    resp
}

/// A topic config's synonyms as Kafka lists them: the topic's own value,
/// the dynamic broker configs (this broker's, then the cluster's), each broker
/// key the broker's properties set, in precedence order, then the default
/// under the broker key, which Kafka names only for a config with a single
/// broker key (`retention.ms`, whose default comes from
/// `log.retention.hours`, lists none).
fn topic_synonyms(
    e: &TopicConfigEntry,
    server: &ServerConfig,
    dynamic: &DynamicBrokerConfigs,
    own: Option<&String>,
) -> Vec<DescribeConfigsSynonym> {
    let mut out = Vec::new();
    if let Some(v) = own {
        out.push(synonym(e.name, v.clone(), SOURCE_TOPIC));
    }
    out.extend(broker_synonyms(e, server, dynamic));
    out
}

/// The broker-level synonyms of a topic config, most precedent first.
fn broker_synonyms(
    e: &TopicConfigEntry,
    server: &ServerConfig,
    dynamic: &DynamicBrokerConfigs,
) -> Vec<DescribeConfigsSynonym> {
    let mut out = Vec::new();
    if let Some(&key) = e.synonyms.first() {
        if let Some(v) = dynamic.broker.get(key) {
            out.push(synonym(key, v.clone(), SOURCE_DYNAMIC_BROKER));
        }
        if let Some(v) = dynamic.cluster.get(key) {
            out.push(synonym(key, v.clone(), SOURCE_DYNAMIC_DEFAULT_BROKER));
        }
    }
    for key in e.synonyms {
        if let Some(v) = server.explicit.get(*key) {
            out.push(synonym(key, v.clone(), SOURCE_STATIC_BROKER));
        }
    }
    if let ([key], Some(default)) = (e.synonyms, e.default) {
        out.push(synonym(key, default.to_string(), SOURCE_DEFAULT));
    }
    out
}

/// A dynamic broker config (a topic config's first broker key) as the
/// BROKER resource lists it: its effective value and source, alterable.
fn dynamic_entry(
    e: &TopicConfigEntry,
    server: &ServerConfig,
    dynamic: &DynamicBrokerConfigs,
    include_synonyms: bool,
) -> DescribeConfigsResourceResult {
    let key = e.synonyms[0];
    let (value, source) = e
        .broker_default_with(server, dynamic)
        .unwrap_or((String::new(), BrokerSource::Default));
    let mut c = entry(key, value, source_code(source), false);
    c.config_type = e.config_type();
    if include_synonyms {
        c.synonyms = broker_synonyms(e, server, dynamic);
    }
    c
}

/// Kafka's `ConfigSource` code of a broker-level value.
pub fn source_code(source: BrokerSource) -> i8 {
    match source {
        BrokerSource::DynamicBroker => SOURCE_DYNAMIC_BROKER,
        BrokerSource::DynamicDefault => SOURCE_DYNAMIC_DEFAULT_BROKER,
        BrokerSource::Static => SOURCE_STATIC_BROKER,
        BrokerSource::Default => SOURCE_DEFAULT,
    }
}

fn synonym(name: &str, value: String, source: i8) -> DescribeConfigsSynonym {
    let mut s = DescribeConfigsSynonym::default();
    s.name = str_bytes(name);
    s.value = Some(str_bytes(value));
    s.source = source;
    s
}
