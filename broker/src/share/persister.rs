//! The persister: how a share-partition leader (or the group coordinator)
//! reaches the share coordinator of a share-partition, wherever it runs, as
//! Kafka's `DefaultStatePersister` does. The coordinator is the leader of the
//! share-partition's `__share_group_state` partition in this node's
//! metadata image: a direct call when that is this node, a request over the
//! inter-broker listener otherwise. NOT_COORDINATOR,
//! COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS and lost
//! connections are retried with backoff (leadership is moving, or the new
//! coordinator is still loading) until a deadline; every other answer is
//! final.

use std::time::Duration;

use kafka_protocol::messages::{
    delete_share_group_state_request, initialize_share_group_state_request,
    read_share_group_state_request, read_share_group_state_summary_request,
    write_share_group_state_request, ApiKey, DeleteShareGroupStateResponse,
    InitializeShareGroupStateResponse, ReadShareGroupStateResponse,
    ReadShareGroupStateSummaryResponse, WriteShareGroupStateResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::coordinator::{
    coordinator_key, ensure_state_topic, ShareCoordError, ShareCoordinator, StateSummary,
    SHARE_STATE_TOPIC, UNINITIALIZED_READ,
};
use super::partition::{RecordState, StateBatch};
use super::records::SharePartitionKey;
use super::state::ShareState;
use super::store::Write;
use crate::broker::Broker;
use crate::types::{NodeId, TopicPartition};

/// How long one persister call keeps retrying a moving coordinator.
const DEADLINE: Duration = Duration::from_secs(15);
const BACKOFF_FIRST: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const PURPOSE: &str = "share-state";

/// One call to the share coordinator.
enum Op<'a> {
    Initialize { state_epoch: i32, start_offset: i64 },
    Read { leader_epoch: i32 },
    Write(&'a Write),
    Delete,
    Summary,
}

enum Answer {
    Done,
    State(ShareState),
    Summary(StateSummary),
}

pub struct Persister {
    peers: crate::net::PeerPool,
}

impl Default for Persister {
    fn default() -> Self {
        Persister {
            peers: crate::net::PeerPool::new(REQUEST_TIMEOUT, CONNECT_TIMEOUT),
        }
    }
}

impl Persister {
    pub async fn initialize(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
        state_epoch: i32,
        start_offset: i64,
    ) -> Result<(), ShareCoordError> {
        let op = Op::Initialize {
            state_epoch,
            start_offset,
        };
        self.call(broker, key, op).await.map(drop)
    }

    pub async fn read(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
        leader_epoch: i32,
    ) -> Result<ShareState, ShareCoordError> {
        match self.call(broker, key, Op::Read { leader_epoch }).await? {
            Answer::State(s) => Ok(s),
            _ => unreachable!("a read answers a state"),
        }
    }

    pub async fn write(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
        w: &Write,
    ) -> Result<(), ShareCoordError> {
        self.call(broker, key, Op::Write(w)).await.map(drop)
    }

    pub async fn delete(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
    ) -> Result<(), ShareCoordError> {
        self.call(broker, key, Op::Delete).await.map(drop)
    }

    pub async fn read_summary(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
    ) -> Result<StateSummary, ShareCoordError> {
        match self.call(broker, key, Op::Summary).await? {
            Answer::Summary(s) => Ok(s),
            _ => unreachable!("a summary read answers a summary"),
        }
    }

    /// The end offset of `tp` (its high watermark) as its leader knows
    /// it, for a share group's lag: this node's replica when it leads,
    /// else a ListOffsets to the leader. `None`: no leader answered.
    pub async fn end_offset(&self, broker: &Broker, tp: &TopicPartition) -> Option<i64> {
        use kafka_protocol::messages::list_offsets_request::*;
        use kafka_protocol::messages::{
            BrokerId, ListOffsetsRequest, ListOffsetsResponse, TopicName,
        };
        let leader = broker
            .metadata
            .image()
            .topics
            .get(tp.topic.as_ref())
            .and_then(|t| t.partitions.get(tp.partition as usize))
            .map(|p| p.leader)?;
        if leader == broker.node_id() || leader.0 < 0 {
            let part = broker.replicas.get(tp)?;
            let part = part.lock().expect("partition poisoned");
            return Some(part.high_watermark().0);
        }
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(tp.partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(-1)])]);
        let resp: ListOffsetsResponse = self
            .peers
            .call(broker, leader, PURPOSE, ApiKey::ListOffsets, 7, &req)
            .await
            .ok()?;
        resp.topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == tp.partition && p.error_code == 0 && p.offset >= 0)
            .map(|p| p.offset)
    }

    async fn call(
        &self,
        broker: &Broker,
        key: &SharePartitionKey,
        op: Op<'_>,
    ) -> Result<Answer, ShareCoordError> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let mut backoff = BACKOFF_FIRST;
        loop {
            let outcome = match coordinator(broker, key).await {
                Ok(node) if node == broker.node_id() => local(broker, key, &op).await,
                Ok(node) => self.remote(broker, node, key, &op).await,
                Err(e) => Err(e),
            };
            let retriable = matches!(
                outcome,
                Err(ShareCoordError::NotCoordinator | ShareCoordError::CoordinatorNotAvailable)
            );
            if !retriable || tokio::time::Instant::now() + backoff > deadline {
                return outcome;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn remote(
        &self,
        broker: &Broker,
        node: NodeId,
        key: &SharePartitionKey,
        op: &Op<'_>,
    ) -> Result<Answer, ShareCoordError> {
        let group = StrBytes::from_string(key.group_id.clone());
        // A lost connection is retried like a moving coordinator.
        let unavailable = |e: crate::net::CallError| {
            tracing::debug!(%node, error = %e, "share coordinator call failed");
            ShareCoordError::CoordinatorNotAvailable
        };
        match op {
            Op::Initialize {
                state_epoch,
                start_offset,
            } => {
                use initialize_share_group_state_request::*;
                let req = InitializeShareGroupStateRequest::default()
                    .with_group_id(group)
                    .with_topics(vec![InitializeStateData::default()
                        .with_topic_id(key.topic_id)
                        .with_partitions(vec![PartitionData::default()
                            .with_partition(key.partition)
                            .with_state_epoch(*state_epoch)
                            .with_start_offset(*start_offset)])]);
                let resp: InitializeShareGroupStateResponse = self
                    .peers
                    .call(
                        broker,
                        node,
                        PURPOSE,
                        ApiKey::InitializeShareGroupState,
                        0,
                        &req,
                    )
                    .await
                    .map_err(unavailable)?;
                done(
                    resp.results
                        .first()
                        .and_then(|t| t.partitions.first())
                        .map(|p| p.error_code),
                )
            }
            Op::Read { leader_epoch } => {
                use read_share_group_state_request::*;
                let req = ReadShareGroupStateRequest::default()
                    .with_group_id(group)
                    .with_topics(vec![ReadStateData::default()
                        .with_topic_id(key.topic_id)
                        .with_partitions(vec![PartitionData::default()
                            .with_partition(key.partition)
                            .with_leader_epoch(*leader_epoch)])]);
                let resp: ReadShareGroupStateResponse = self
                    .peers
                    .call(broker, node, PURPOSE, ApiKey::ReadShareGroupState, 0, &req)
                    .await
                    .map_err(unavailable)?;
                let Some(p) = resp.results.first().and_then(|t| t.partitions.first()) else {
                    return Err(ShareCoordError::CoordinatorNotAvailable);
                };
                if p.error_code == ResponseError::InvalidRequest.code()
                    && p.error_message.as_deref() == Some(UNINITIALIZED_READ)
                {
                    return Err(ShareCoordError::Uninitialized);
                }
                error_of(p.error_code)?;
                let batches = p
                    .state_batches
                    .iter()
                    .map(|b| {
                        Some(StateBatch {
                            first_offset: b.first_offset,
                            last_offset: b.last_offset,
                            state: RecordState::from_id(b.delivery_state)?,
                            delivery_count: b.delivery_count,
                        })
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or(ShareCoordError::InvalidRequest(
                        "the share coordinator answered an unknown delivery state",
                    ))?;
                Ok(Answer::State(ShareState {
                    state_epoch: p.state_epoch,
                    leader_epoch: *leader_epoch,
                    start_offset: p.start_offset,
                    batches,
                }))
            }
            Op::Write(w) => {
                use write_share_group_state_request::*;
                let req = WriteShareGroupStateRequest::default()
                    .with_group_id(group)
                    .with_topics(vec![WriteStateData::default()
                        .with_topic_id(key.topic_id)
                        .with_partitions(vec![PartitionData::default()
                            .with_partition(key.partition)
                            .with_state_epoch(w.state_epoch)
                            .with_leader_epoch(w.leader_epoch)
                            .with_start_offset(w.start_offset)
                            .with_state_batches(
                                w.batches
                                    .iter()
                                    .map(|b| {
                                        write_share_group_state_request::StateBatch::default()
                                            .with_first_offset(b.first_offset)
                                            .with_last_offset(b.last_offset)
                                            .with_delivery_state(b.state.id())
                                            .with_delivery_count(b.delivery_count)
                                    })
                                    .collect(),
                            )])]);
                let resp: WriteShareGroupStateResponse = self
                    .peers
                    .call(broker, node, PURPOSE, ApiKey::WriteShareGroupState, 0, &req)
                    .await
                    .map_err(unavailable)?;
                done(
                    resp.results
                        .first()
                        .and_then(|t| t.partitions.first())
                        .map(|p| p.error_code),
                )
            }
            Op::Delete => {
                use delete_share_group_state_request::*;
                let req = DeleteShareGroupStateRequest::default()
                    .with_group_id(group)
                    .with_topics(vec![DeleteStateData::default()
                        .with_topic_id(key.topic_id)
                        .with_partitions(vec![
                            PartitionData::default().with_partition(key.partition)
                        ])]);
                let resp: DeleteShareGroupStateResponse = self
                    .peers
                    .call(
                        broker,
                        node,
                        PURPOSE,
                        ApiKey::DeleteShareGroupState,
                        0,
                        &req,
                    )
                    .await
                    .map_err(unavailable)?;
                done(
                    resp.results
                        .first()
                        .and_then(|t| t.partitions.first())
                        .map(|p| p.error_code),
                )
            }
            Op::Summary => {
                use read_share_group_state_summary_request::*;
                let req = ReadShareGroupStateSummaryRequest::default()
                    .with_group_id(group)
                    .with_topics(vec![ReadStateSummaryData::default()
                        .with_topic_id(key.topic_id)
                        .with_partitions(vec![
                            PartitionData::default().with_partition(key.partition)
                        ])]);
                let resp: ReadShareGroupStateSummaryResponse = self
                    .peers
                    .call(
                        broker,
                        node,
                        PURPOSE,
                        ApiKey::ReadShareGroupStateSummary,
                        0,
                        &req,
                    )
                    .await
                    .map_err(unavailable)?;
                let Some(p) = resp.results.first().and_then(|t| t.partitions.first()) else {
                    return Err(ShareCoordError::CoordinatorNotAvailable);
                };
                error_of(p.error_code)?;
                let delivery_complete_count = p
                    .unknown_tagged_fields
                    .get(&DELIVERY_COMPLETE_TAG)
                    .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
                    .map_or(-1, i64::from_be_bytes);
                Ok(Answer::Summary(StateSummary {
                    state_epoch: p.state_epoch,
                    leader_epoch: p.leader_epoch,
                    start_offset: p.start_offset,
                    delivery_complete_count,
                }))
            }
        }
    }
}

/// The tagged field in which our share coordinators answer a
/// ReadShareGroupStateSummary v0 with the delivery-complete count (an int64)
/// that Kafka's v1 carries as a field, which kafka-protocol 0.18 cannot
/// encode. Only our brokers send it; other readers skip an unknown tag.
pub const DELIVERY_COMPLETE_TAG: i32 = 10_000;

/// The coordinator of `key` in this node's metadata image, creating
/// `__share_group_state` on first use as FindCoordinator does.
async fn coordinator(broker: &Broker, key: &SharePartitionKey) -> Result<NodeId, ShareCoordError> {
    ensure_state_topic(broker)
        .await
        .map_err(|_| ShareCoordError::CoordinatorNotAvailable)?;
    let ck = coordinator_key(&key.group_id, key.topic_id, key.partition);
    let partition = ShareCoordinator::partition_for(broker, &ck);
    let image = broker.metadata.image();
    let leader = image
        .topics
        .get(SHARE_STATE_TOPIC)
        .and_then(|t| t.partitions.get(partition as usize))
        .map(|p| p.leader)
        .filter(|l| l.0 >= 0);
    match leader {
        Some(l) => Ok(l),
        // A node that has not registered yet is the whole cluster.
        None if image.brokers.is_empty() => Ok(broker.node_id()),
        None => Err(ShareCoordError::CoordinatorNotAvailable),
    }
}

async fn local(
    broker: &Broker,
    key: &SharePartitionKey,
    op: &Op<'_>,
) -> Result<Answer, ShareCoordError> {
    let c = &broker.share_state;
    match op {
        Op::Initialize {
            state_epoch,
            start_offset,
        } => c
            .initialize(key, *state_epoch, *start_offset)
            .await
            .map(|()| Answer::Done),
        Op::Read { leader_epoch } => c.read(key, *leader_epoch).await.map(Answer::State),
        Op::Write(w) => c.write(key, w).await.map(|()| Answer::Done),
        Op::Delete => c.delete(key).await.map(|()| Answer::Done),
        Op::Summary => c.read_summary(key).await.map(Answer::Summary),
    }
}

/// The answer to a call that returns no state, from its one partition's
/// error code (`None`: the coordinator answered no partition).
fn done(code: Option<i16>) -> Result<Answer, ShareCoordError> {
    error_of(code.unwrap_or(ResponseError::UnknownServerError.code())).map(|()| Answer::Done)
}

/// A coordinator's error code as this side's error.
fn error_of(code: i16) -> Result<(), ShareCoordError> {
    if code == 0 {
        return Ok(());
    }
    Err(match ResponseError::try_from_code(code) {
        Some(ResponseError::NotCoordinator) => ShareCoordError::NotCoordinator,
        Some(ResponseError::CoordinatorNotAvailable | ResponseError::CoordinatorLoadInProgress) => {
            ShareCoordError::CoordinatorNotAvailable
        }
        Some(ResponseError::UnknownTopicOrPartition) => ShareCoordError::UnknownTopicOrPartition,
        Some(ResponseError::FencedLeaderEpoch) => ShareCoordError::FencedLeaderEpoch,
        Some(ResponseError::FencedStateEpoch) => ShareCoordError::FencedStateEpoch,
        Some(ResponseError::RequestTimedOut) => ShareCoordError::RequestTimedOut,
        Some(ResponseError::ClusterAuthorizationFailed) => {
            ShareCoordError::ClusterAuthorizationFailed
        }
        _ => ShareCoordError::InvalidRequest("refused by the share coordinator"),
    })
}
