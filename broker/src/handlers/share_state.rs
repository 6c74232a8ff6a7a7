//! The share coordinator's APIs (keys 83-87): InitializeShareGroupState,
//! ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState and
//! ReadShareGroupStateSummary. Share-partition leaders and the group
//! coordinator send them to the coordinator of each share-partition (the
//! leader of its `__share_group_state` partition; FindCoordinator key type
//! 2). Each partition is answered on its own, as Kafka's
//! `ShareCoordinatorService` does. Callers need CLUSTER_ACTION on the
//! cluster, as for Kafka's other inter-broker APIs; without it every
//! partition is CLUSTER_AUTHORIZATION_FAILED.

use kafka_protocol::messages::{
    delete_share_group_state_response, initialize_share_group_state_response,
    read_share_group_state_response, read_share_group_state_summary_response,
    write_share_group_state_response, DeleteShareGroupStateRequest, DeleteShareGroupStateResponse,
    InitializeShareGroupStateRequest, InitializeShareGroupStateResponse,
    ReadShareGroupStateRequest, ReadShareGroupStateResponse, ReadShareGroupStateSummaryRequest,
    ReadShareGroupStateSummaryResponse, WriteShareGroupStateRequest, WriteShareGroupStateResponse,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::broker::Broker;
use crate::share::coordinator::ShareCoordError;
use crate::share::partition::{RecordState, StateBatch as ShareBatch};
use crate::share::records::SharePartitionKey;
use crate::share::store::Write;

fn key(group_id: &StrBytes, topic_id: Uuid, partition: i32) -> SharePartitionKey {
    SharePartitionKey {
        group_id: group_id.to_string(),
        topic_id,
        partition,
    }
}

fn message(e: &ShareCoordError) -> Option<StrBytes> {
    Some(StrBytes::from_string(e.to_string()))
}

/// A caller without ClusterAction gets CLUSTER_AUTHORIZATION_FAILED for
/// every partition.
fn authorized(allowed: bool) -> Result<(), ShareCoordError> {
    if allowed {
        Ok(())
    } else {
        Err(ShareCoordError::ClusterAuthorizationFailed)
    }
}

/// The response's error for a failed partition: its code and message.
fn failed(e: Option<ShareCoordError>) -> (i16, Option<StrBytes>) {
    match e {
        None => (0, None),
        Some(e) => (e.code(), message(&e)),
    }
}

pub async fn initialize(
    broker: &Broker,
    allowed: bool,
    req: InitializeShareGroupStateRequest,
) -> InitializeShareGroupStateResponse {
    use initialize_share_group_state_response::*;
    let mut resp = InitializeShareGroupStateResponse::default();
    for t in req.topics {
        let mut result = InitializeStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&req.group_id, t.topic_id, p.partition);
            let outcome = async {
                authorized(allowed)?;
                broker
                    .share_state
                    .initialize(&k, p.state_epoch, p.start_offset)
                    .await
            };
            let (code, msg) = failed(outcome.await.err());
            result.partitions.push(
                PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_error_message(msg),
            );
        }
        resp.results.push(result);
    }
    resp
}

pub async fn read(
    broker: &Broker,
    allowed: bool,
    req: ReadShareGroupStateRequest,
) -> ReadShareGroupStateResponse {
    use read_share_group_state_response::*;
    let mut resp = ReadShareGroupStateResponse::default();
    for t in req.topics {
        let mut result = ReadStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&req.group_id, t.topic_id, p.partition);
            let mut out = PartitionResult::default().with_partition(p.partition);
            let outcome = async {
                authorized(allowed)?;
                broker.share_state.read(&k, p.leader_epoch).await
            };
            match outcome.await {
                Ok(state) => {
                    out.state_epoch = state.state_epoch;
                    out.start_offset = state.start_offset;
                    out.state_batches = state
                        .batches
                        .iter()
                        .map(|b| {
                            StateBatch::default()
                                .with_first_offset(b.first_offset)
                                .with_last_offset(b.last_offset)
                                .with_delivery_state(b.state.id())
                                .with_delivery_count(b.delivery_count)
                        })
                        .collect();
                }
                Err(e) => {
                    (out.error_code, out.error_message) = failed(Some(e));
                    out.start_offset = -1;
                }
            }
            result.partitions.push(out);
        }
        resp.results.push(result);
    }
    resp
}

pub async fn write(
    broker: &Broker,
    allowed: bool,
    req: WriteShareGroupStateRequest,
) -> WriteShareGroupStateResponse {
    use write_share_group_state_response::*;
    let mut resp = WriteShareGroupStateResponse::default();
    for t in req.topics {
        let mut result = WriteStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&req.group_id, t.topic_id, p.partition);
            let batches: Option<Vec<ShareBatch>> = p
                .state_batches
                .iter()
                .map(|b| {
                    let state = RecordState::from_id(b.delivery_state)?;
                    (b.first_offset >= 0 && b.first_offset <= b.last_offset).then_some(ShareBatch {
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        state,
                        delivery_count: b.delivery_count,
                    })
                })
                .collect();
            let outcome = match batches {
                _ if !allowed => authorized(allowed),
                None => Err(ShareCoordError::InvalidRequest(
                    "a state batch has an unknown delivery state or bad offsets",
                )),
                Some(mut batches) => {
                    batches.sort_by_key(|b| b.first_offset);
                    if batches
                        .windows(2)
                        .any(|w| w[0].last_offset >= w[1].first_offset)
                    {
                        Err(ShareCoordError::InvalidRequest("the state batches overlap"))
                    } else {
                        let w = Write {
                            state_epoch: p.state_epoch,
                            leader_epoch: p.leader_epoch,
                            start_offset: p.start_offset,
                            batches,
                        };
                        broker.share_state.write(&k, &w).await
                    }
                }
            };
            let (code, msg) = failed(outcome.err());
            result.partitions.push(
                PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_error_message(msg),
            );
        }
        resp.results.push(result);
    }
    resp
}

pub async fn delete(
    broker: &Broker,
    allowed: bool,
    req: DeleteShareGroupStateRequest,
) -> DeleteShareGroupStateResponse {
    use delete_share_group_state_response::*;
    let mut resp = DeleteShareGroupStateResponse::default();
    for t in req.topics {
        let mut result = DeleteStateResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&req.group_id, t.topic_id, p.partition);
            let outcome = async {
                authorized(allowed)?;
                broker.share_state.delete(&k).await
            };
            let (code, msg) = failed(outcome.await.err());
            result.partitions.push(
                PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(code)
                    .with_error_message(msg),
            );
        }
        resp.results.push(result);
    }
    resp
}

pub async fn read_summary(
    broker: &Broker,
    allowed: bool,
    req: ReadShareGroupStateSummaryRequest,
) -> ReadShareGroupStateSummaryResponse {
    use read_share_group_state_summary_response::*;
    let mut resp = ReadShareGroupStateSummaryResponse::default();
    for t in req.topics {
        let mut result = ReadStateSummaryResult::default().with_topic_id(t.topic_id);
        for p in t.partitions {
            let k = key(&req.group_id, t.topic_id, p.partition);
            let mut out = PartitionResult::default().with_partition(p.partition);
            let outcome = async {
                authorized(allowed)?;
                broker.share_state.read_summary(&k).await
            };
            match outcome.await {
                Ok(s) => {
                    out.state_epoch = s.state_epoch;
                    out.leader_epoch = s.leader_epoch;
                    out.start_offset = s.start_offset;
                    out.unknown_tagged_fields.insert(
                        crate::share::persister::DELIVERY_COMPLETE_TAG,
                        bytes::Bytes::copy_from_slice(&s.delivery_complete_count.to_be_bytes()),
                    );
                }
                Err(e) => {
                    (out.error_code, out.error_message) = failed(Some(e));
                    out.start_offset = -1;
                }
            }
            result.partitions.push(out);
        }
        resp.results.push(result);
    }
    resp
}
