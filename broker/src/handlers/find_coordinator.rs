//! FindCoordinator (key 10): which broker coordinates a group, a
//! transactional id or (v6+, between brokers) a share-partition. v4+ batch
//! keys. The first lookup of a group creates `__consumer_offsets`, of a
//! transactional id `__transaction_state` and of a share-partition
//! `__share_group_state`, as Kafka does, so a broker never used for one
//! never has its topic.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{Broker, CreateTopicError, NewTopic};
use crate::coordinator::OFFSETS_TOPIC;
use crate::share::coordinator::{ShareCoordinator, SHARE_STATE_TOPIC};
use crate::txn::service::TXN_TOPIC;

/// `key_type` values.
const GROUP: i8 = 0;
const TRANSACTION: i8 = 1;
const SHARE: i8 = 2;

pub async fn handle(
    broker: &Broker,
    listener: &str,
    version: i16,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    let keys = if version >= 4 {
        req.coordinator_keys
    } else {
        vec![req.key]
    };
    let mut coordinators = Vec::with_capacity(keys.len());
    for key in keys {
        coordinators.push(find(broker, listener, version, key, req.key_type).await);
    }
    let mut resp = FindCoordinatorResponse::default();
    if version < 4 {
        // One key: the answer goes in the top-level fields.
        if let Some(c) = coordinators.pop() {
            resp.error_code = c.error_code;
            resp.error_message = if version >= 1 { c.error_message } else { None };
            resp.node_id = c.node_id;
            resp.host = c.host;
            resp.port = c.port;
        }
    } else {
        resp.coordinators = coordinators;
    }
    resp
}

async fn find(
    broker: &Broker,
    listener: &str,
    version: i16,
    key: StrBytes,
    key_type: i8,
) -> Coordinator {
    let mut c = Coordinator::default();
    c.key = key;
    c.node_id = BrokerId(-1);
    c.host = str_bytes("");
    c.port = -1;
    let error = match key_type {
        GROUP => match ensure_offsets_topic(broker).await {
            Ok(()) => {
                if let Err(e) = broker.groups.sync_ownership(broker).await {
                    tracing::warn!(error = %e, "loading groups after creating {OFFSETS_TOPIC}");
                }
                let partition = crate::coordinator::partition_of(broker, &c.key);
                match leader_of(broker, listener, OFFSETS_TOPIC, partition, &mut c) {
                    Ok(()) => return c,
                    Err(e) => e,
                }
            }
            Err(msg) => (ResponseError::CoordinatorNotAvailable, msg),
        },
        TRANSACTION => match ensure_transaction_topic(broker).await {
            Ok(()) => {
                let partition = broker.txn.partition_for(broker, &c.key);
                match leader_of(broker, listener, TXN_TOPIC, partition, &mut c) {
                    Ok(()) => return c,
                    Err(e) => e,
                }
            }
            Err(msg) => (ResponseError::CoordinatorNotAvailable, msg),
        },
        // Kafka's `SharePartitionKey.validate`: "group:topicId:partition".
        SHARE if version >= 6 => match share_key_is_valid(&c.key) {
            false => (
                ResponseError::InvalidRequest,
                format!("invalid share coordinator key {:?}", c.key.as_str()),
            ),
            true => match crate::share::coordinator::ensure_state_topic(broker).await {
                Ok(()) => {
                    let partition = ShareCoordinator::partition_for(broker, &c.key);
                    match leader_of(broker, listener, SHARE_STATE_TOPIC, partition, &mut c) {
                        Ok(()) => return c,
                        Err(e) => e,
                    }
                }
                Err(msg) => (ResponseError::CoordinatorNotAvailable, msg),
            },
        },
        other => (
            ResponseError::InvalidRequest,
            format!("unsupported coordinator key type {other}"),
        ),
    };
    c.error_code = error.0.code();
    c.error_message = Some(str_bytes(error.1));
    c
}

/// Names the leader of `topic`'s `partition` as the coordinator: the
/// coordinator of a key is the leader of its partition.
fn leader_of(
    broker: &Broker,
    listener: &str,
    topic: &str,
    partition: i32,
    c: &mut Coordinator,
) -> Result<(), (ResponseError, String)> {
    let image = broker.metadata.image();
    let leader = image
        .topics
        .get(topic)
        .and_then(|t| t.partitions.get(partition as usize))
        .map(|p| p.leader)
        .and_then(|leader| image.brokers.get(&leader))
        .filter(|b| !b.fenced);
    match (leader, image.brokers.is_empty()) {
        (Some(b), _) => match b.endpoint(listener) {
            Some((host, port)) => {
                c.node_id = BrokerId(b.node_id.0);
                c.host = str_bytes(host.to_string());
                c.port = i32::from(port);
                Ok(())
            }
            None => Err((
                ResponseError::CoordinatorNotAvailable,
                format!(
                    "the leader of partition {partition} of {topic} has no listener {listener}"
                ),
            )),
        },
        // A node that has not registered yet is the whole cluster.
        (None, true) => {
            let l = broker.config.advertised_listener(listener);
            c.node_id = BrokerId(broker.node_id().0);
            c.host = str_bytes(l.host.clone());
            c.port = i32::from(l.port);
            Ok(())
        }
        (None, false) => Err((
            ResponseError::CoordinatorNotAvailable,
            format!("partition {partition} of {topic} has no leader"),
        )),
    }
}

/// Creates `__transaction_state` if it does not exist, with Kafka's
/// enforced configs (`TransactionLog`: compacted, uncompressed, no unclean
/// election, its own min ISR), and loads the ids this node then leads.
async fn ensure_transaction_topic(broker: &Broker) -> Result<(), String> {
    if !broker.metadata.image().topics.contains_key(TXN_TOPIC) {
        let c = &broker.config;
        let configs = [
            ("cleanup.policy", "compact".to_string()),
            ("compression.type", "uncompressed".to_string()),
            ("unclean.leader.election.enable", "false".to_string()),
            (
                "min.insync.replicas",
                c.transaction_state_log_min_isr.to_string(),
            ),
            (
                "segment.bytes",
                c.transaction_state_log_segment_bytes.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let topic = NewTopic {
            name: TXN_TOPIC.to_string(),
            num_partitions: c.transaction_state_log_num_partitions,
            replication_factor: c.transaction_state_log_replication_factor,
            assignments: Vec::new(),
            configs,
        };
        match broker.create_topic(topic, false).await {
            Ok(_) | Err(CreateTopicError::TopicAlreadyExists(_)) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot create {TXN_TOPIC}");
                return Err(e.to_string());
            }
        }
    }
    if let Some(me) = broker.txn.owner() {
        if let Err(e) = broker.txn.sync_ownership(&me).await {
            tracing::warn!(error = %e, "loading transactions after creating {TXN_TOPIC}");
        }
    }
    Ok(())
}

/// A share coordinator key: a non-empty group id, a topic id (Kafka's
/// URL-safe base64 of 16 bytes) and a partition number, colon-separated.
/// The group id may itself hold colons.
fn share_key_is_valid(key: &str) -> bool {
    use base64::Engine;
    let mut parts = key.rsplitn(3, ':');
    let (Some(partition), Some(topic_id), Some(group)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !group.is_empty()
        && partition.parse::<i32>().is_ok_and(|p| p >= 0)
        && base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(topic_id)
            .is_ok_and(|b| b.len() == 16)
}

/// Creates `__consumer_offsets` if it does not exist. A concurrent lookup
/// that created it first is success.
async fn ensure_offsets_topic(broker: &Broker) -> Result<(), String> {
    if broker.metadata.image().topics.contains_key(OFFSETS_TOPIC) {
        return Ok(());
    }
    let configs = [
        ("cleanup.policy", "compact".to_string()),
        ("compression.type", "producer".to_string()),
        (
            "segment.bytes",
            broker.config.offsets_topic_segment_bytes.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let topic = NewTopic {
        name: OFFSETS_TOPIC.to_string(),
        num_partitions: broker.config.offsets_topic_num_partitions,
        replication_factor: broker.config.offsets_topic_replication_factor,
        assignments: Vec::new(),
        configs,
    };
    match broker.create_topic(topic, false).await {
        Ok(_) | Err(CreateTopicError::TopicAlreadyExists(_)) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create {OFFSETS_TOPIC}");
            Err(e.to_string())
        }
    }
}
