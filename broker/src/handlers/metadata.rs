//! Metadata (key 3): brokers, topics with ids, partitions with leaders and
//! epochs; auto-creates unknown topics when the broker and request allow.
//!
//! Each requested topic is answered once, however often the request names
//! it, as Kafka does (its handler works on the set of names and ids): the
//! response is bounded by the distinct topics asked for, not by the
//! request's length. (The request itself was charged its decoded size
//! before it was decoded.)

use std::collections::{BTreeMap, HashSet};

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::{str_bytes, AUTHORIZED_OPERATIONS_OMITTED};
use crate::authz::{Authz, Operation, ResourceType, CLUSTER_OPERATIONS, TOPIC_OPERATIONS};
use crate::broker::{Broker, NewTopic};
use crate::metadata::{MetadataImage, TopicImage, NO_LEADER};

/// (node id, host, port, rack) of every registered, unfenced broker with
/// the client's listener: the ones clients may be sent to (Kafka lists
/// fenced brokers nowhere, and a broker without the listener is left out).
pub fn live_brokers(broker: &Broker, listener: &str) -> Vec<(i32, String, i32, Option<String>)> {
    let image = broker.metadata.image();
    if image.brokers.is_empty() {
        let l = broker.config.advertised_listener(listener);
        return vec![(broker.node_id().0, l.host.clone(), l.port as i32, None)];
    }
    image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .filter_map(|b| {
            let (host, port) = b.endpoint(listener)?;
            Some((b.node_id.0, host.to_string(), port as i32, b.rack.clone()))
        })
        .collect()
}

/// A topic as Metadata describes it. A partition without a leader carries
/// LEADER_NOT_AVAILABLE, and replicas on fenced brokers are listed offline, as
/// Kafka does.
pub fn topic_response(image: &MetadataImage, t: &TopicImage) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(str_bytes(t.name.clone())));
    topic.topic_id = t.topic_id;
    topic.is_internal = t.name.starts_with("__");
    topic.topic_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    topic.partitions = t
        .partitions
        .iter()
        .map(|p| {
            let mut mp = MetadataResponsePartition::default();
            mp.partition_index = p.partition;
            mp.leader_id = BrokerId(p.leader.0);
            mp.leader_epoch = p.leader_epoch.0;
            mp.replica_nodes = p.replicas.iter().map(|r| BrokerId(r.0)).collect();
            mp.isr_nodes = p.isr.iter().map(|r| BrokerId(r.0)).collect();
            mp.offline_replicas = p
                .replicas
                .iter()
                .filter(|r| image.brokers.get(r).is_some_and(|b| b.fenced))
                .map(|r| BrokerId(r.0))
                .collect();
            if p.leader == NO_LEADER {
                mp.error_code = ResponseError::LeaderNotAvailable.code();
            }
            mp
        })
        .collect();
    topic
}

fn error_topic(name: Option<String>, id: Uuid, code: ResponseError) -> MetadataResponseTopic {
    let mut t = MetadataResponseTopic::default();
    t.name = name.map(|n| TopicName(str_bytes(n)));
    t.topic_id = id;
    t.error_code = code.code();
    t.topic_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    t
}

pub async fn handle(
    broker: &Broker,
    authz: &Authz<'_>,
    listener: &str,
    version: i16,
    req: MetadataRequest,
) -> MetadataResponse {
    let mut resp = respond(broker, authz, listener, version, &req).await;
    // Authorized operations, when asked for (Kafka fills them for the
    // topics it describes and, before v11, for the cluster).
    if req.include_cluster_authorized_operations && version <= 10 {
        resp.cluster_authorized_operations = authz.operations(
            ResourceType::Cluster,
            crate::authz::CLUSTER_NAME,
            CLUSTER_OPERATIONS,
        );
    }
    if req.include_topic_authorized_operations {
        for t in resp.topics.iter_mut().filter(|t| t.error_code == 0) {
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    authz.operations(ResourceType::Topic, name.0.as_str(), TOPIC_OPERATIONS);
            }
        }
    }
    resp
}

async fn respond(
    broker: &Broker,
    authz: &Authz<'_>,
    listener: &str,
    version: i16,
    req: &MetadataRequest,
) -> MetadataResponse {
    let mut resp = MetadataResponse::default();
    resp.brokers = live_brokers(broker, listener)
        .into_iter()
        .map(|(id, host, port, rack)| {
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(id);
            b.host = str_bytes(host);
            b.port = port;
            b.rack = rack.map(str_bytes);
            b
        })
        .collect();
    resp.controller_id = BrokerId(super::metadata::controller_id(broker).0);
    resp.cluster_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;

    // v0: an empty list means all topics; v1+: null means all topics.
    let requested = match &req.topics {
        None => None,
        Some(t) if t.is_empty() && version == 0 => None,
        Some(t) => Some(t),
    };
    let image = broker.metadata.image();
    resp.cluster_id = Some(str_bytes(image.cluster_id.clone()));
    let Some(requested) = requested else {
        // Topics the principal may not describe are left out, as Kafka
        // does (and does not count as denials).
        resp.topics = image
            .topics
            .values()
            .filter(|t| authz.may(Operation::Describe, ResourceType::Topic, &t.name))
            .map(|t| topic_response(&image, t))
            .collect();
        return resp;
    };
    // Auto-creation is allowed on v0-3 whenever the broker enables it; from
    // v4 the client must ask for it too.
    let auto_create =
        broker.config.auto_create_topics_enable && (version < 4 || req.allow_auto_topic_creation);
    let mut seen_names: HashSet<&str> = HashSet::new();
    let mut seen_ids: HashSet<Uuid> = HashSet::new();
    let mut out = Vec::new();
    for t in requested {
        let first = match &t.name {
            Some(n) => seen_names.insert(n.0.as_str()),
            None => seen_ids.insert(t.topic_id),
        };
        if !first {
            continue;
        }
        let name = t.name.as_ref().map(|n| n.0.to_string());
        let found = match &name {
            Some(n) => image.topics.get(n),
            None => image.topic_by_id(t.topic_id),
        };
        // Kafka answers TOPIC_AUTHORIZATION_FAILED for a topic the principal
        // may not describe, whether or not it exists (by id: only once the
        // id is known, so ids cannot be probed for names).
        let described = match (&name, found) {
            (Some(n), _) => Some(n.as_str()),
            (None, Some(img)) => Some(img.name.as_str()),
            (None, None) => None,
        };
        if described.is_some_and(|n| !authz.allows(Operation::Describe, ResourceType::Topic, n)) {
            out.push(error_topic(
                name,
                Uuid::nil(),
                ResponseError::TopicAuthorizationFailed,
            ));
            continue;
        }
        let topic = match (found, name) {
            (Some(img), _) => topic_response(&image, img),
            (None, None) => error_topic(None, t.topic_id, ResponseError::UnknownTopicId),
            (None, Some(n)) => {
                if let Err(_why) = crate::broker::validate_topic_name(&n) {
                    error_topic(Some(n), Uuid::nil(), ResponseError::InvalidTopicException)
                } else if !auto_create {
                    error_topic(Some(n), Uuid::nil(), ResponseError::UnknownTopicOrPartition)
                } else if !authz.may(
                    Operation::Create,
                    ResourceType::Cluster,
                    crate::authz::CLUSTER_NAME,
                ) && !authz.allows(Operation::Create, ResourceType::Topic, &n)
                {
                    // Auto-creation needs Create on the cluster or the topic.
                    error_topic(
                        Some(n),
                        Uuid::nil(),
                        ResponseError::TopicAuthorizationFailed,
                    )
                } else {
                    let new = NewTopic {
                        name: n.clone(),
                        num_partitions: -1,
                        replication_factor: -1,
                        assignments: vec![],
                        configs: BTreeMap::new(),
                    };
                    match broker.create_topic(new, false).await {
                        Ok(_) | Err(crate::broker::CreateTopicError::TopicAlreadyExists(_)) => {
                            let image = broker.metadata.image();
                            match image.topics.get(&n) {
                                Some(img) => topic_response(&image, img),
                                None => error_topic(
                                    Some(n),
                                    Uuid::nil(),
                                    ResponseError::LeaderNotAvailable,
                                ),
                            }
                        }
                        Err(e) => {
                            tracing::warn!(topic = %n, error = %e, "auto-create failed");
                            let mut t = error_topic(
                                Some(n),
                                Uuid::nil(),
                                ResponseError::UnknownTopicOrPartition,
                            );
                            t.error_code = e.code();
                            t
                        }
                    }
                }
            }
        };
        out.push(topic);
    }
    resp.topics = out;
    resp
}

/// The controller id clients see: every node is a voter (combined mode), so
/// the Raft leader is the active controller, as `kafka-metadata-quorum.sh`
/// would name it. Without a known leader, this node answers for itself.
pub(crate) fn controller_id(broker: &Broker) -> crate::types::NodeId {
    broker.metadata.leader().unwrap_or_else(|| broker.node_id())
}
