//! WriteTxnMarkers (key 27): the transaction coordinator ends a transaction
//! in each partition it touched by writing a commit or abort marker there
//! (Kafka's `handleWriteTxnMarkersRequest`). Each partition must be led here
//! (UNKNOWN_TOPIC_OR_PARTITION when this node has no replica of it,
//! NOT_LEADER_OR_FOLLOWER when it only follows), the marker is appended with
//! the producer-state checks of `Partition::write_txn_marker`, and the answer
//! waits until the ISR has it, as an acks=all produce does, at most Kafka's
//! default `request.timeout.ms`.
//!
//! Once a marker is in `__consumer_offsets`, the group coordinator learns
//! the outcome, so the transaction's offset commits become visible or are
//! dropped (Kafka's `onTransactionCompleted`).

use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_request::WritableTxnMarker;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::broker::{now_ms, Broker};
use crate::coordinator::OFFSETS_TOPIC;
use crate::error::PartitionError;
use crate::replica_manager::{wait_for_ack, PartitionRef};
use crate::types::{Offset, TopicPartition};

/// Kafka's `request.timeout.ms` default, which bounds its marker appends.
const MARKER_TIMEOUT_MS: u64 = 30_000;

pub async fn handle(
    broker: &Broker,
    _version: i16,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    write_markers(broker, req).await
}

/// Writes every marker of `req` and answers once each is replicated or has
/// failed. The transaction coordinator calls this directly for partitions
/// led by its own node.
pub async fn write_markers(
    broker: &Broker,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(MARKER_TIMEOUT_MS);
    let now = now_ms();
    let mut results = Vec::with_capacity(req.markers.len());
    let mut pending = Vec::new();
    for (i, marker) in req.markers.iter().enumerate() {
        results.push(append_marker(broker, i, marker, now, &mut pending));
    }
    if !pending.is_empty() {
        // Followers long-polling for data fetch the markers now.
        broker.replicas.appended.notify_waiters();
    }
    // All appended first, then one wait: the partitions replicate together.
    for mut w in pending {
        if let Err(e) = wait_for_ack(&w.part, w.required, &mut w.events, deadline).await {
            let tp = w.part.lock().expect("poisoned").tp.clone();
            results[w.marker].topics[w.topic].partitions[w.partition].error_code = failed(&tp, &e);
        }
    }
    let mut resp = WriteTxnMarkersResponse::default();
    for (marker, result) in req.markers.iter().zip(results) {
        completed(broker, marker, &result).await;
        merge(&mut resp, result);
    }
    resp
}

/// An appended marker waiting for the high watermark.
struct Pending {
    marker: usize,
    topic: usize,
    partition: usize,
    part: PartitionRef,
    required: Offset,
    events: tokio::sync::watch::Receiver<()>,
}

/// Appends marker `index` to every partition it names; what waits for the
/// ISR goes to `pending`, and errors into the result at once.
fn append_marker(
    broker: &Broker,
    index: usize,
    marker: &WritableTxnMarker,
    now: i64,
    pending: &mut Vec<Pending>,
) -> WritableTxnMarkerResult {
    let mut result = WritableTxnMarkerResult::default();
    result.producer_id = marker.producer_id;
    for topic in &marker.topics {
        let name = topic.name.0.to_string();
        let mut t = WritableTxnMarkerTopicResult::default();
        t.name = topic.name.clone();
        for &partition in &topic.partition_indexes {
            let mut p = WritableTxnMarkerPartitionResult::default();
            p.partition_index = partition;
            let tp = TopicPartition::new(name.as_str(), partition);
            let appended = match broker.replicas.get(&tp) {
                None => Err(PartitionError::UnknownTopicOrPartition),
                Some(part) => {
                    let mut locked = part.lock().expect("poisoned");
                    let written = locked.write_txn_marker(
                        marker.producer_id.0,
                        marker.producer_epoch,
                        marker.coordinator_epoch,
                        marker.transaction_result,
                        now,
                    );
                    written.map(|out| Pending {
                        marker: index,
                        topic: result.topics.len(),
                        partition: t.partitions.len(),
                        part: part.clone(),
                        required: out.last_offset.next(),
                        // Under the append's lock: no change after it is missed.
                        events: locked.subscribe(),
                    })
                }
            };
            match appended {
                Ok(w) => pending.push(w),
                Err(e) => p.error_code = failed(&tp, &e),
            }
            t.partitions.push(p);
        }
        result.topics.push(t);
    }
    result
}

/// A marker is written and replicated: the offsets topic's partitions
/// among its successes tell the group coordinator the outcome.
async fn completed(broker: &Broker, marker: &WritableTxnMarker, result: &WritableTxnMarkerResult) {
    let producer_id = marker.producer_id.0;
    let commit = marker.transaction_result;
    let offsets_partitions: Vec<i32> = result
        .topics
        .iter()
        .filter(|t| &*t.name.0 == OFFSETS_TOPIC)
        .flat_map(|t| t.partitions.iter())
        .filter(|p| p.error_code == 0)
        .map(|p| p.partition_index)
        .collect();
    // Kafka's `onTransactionCompleted`: the group coordinator makes the
    // transaction's offsets visible (or drops them) once its marker is in.
    for partition in offsets_partitions {
        broker
            .groups
            .on_txn_marker(partition, producer_id, commit)
            .await;
    }
}

fn failed(tp: &TopicPartition, e: &PartitionError) -> i16 {
    if let PartitionError::Storage(msg) = e {
        tracing::error!(%tp, error = %msg, "transaction marker append failed");
    }
    metrics::counter!("kafka_broker_partition_errors_total", "api" => "WriteTxnMarkers", "code" => e.code().to_string())
        .increment(1);
    e.code()
}

/// Kafka answers one result per producer id: markers for the same producer
/// in one request share it.
fn merge(resp: &mut WriteTxnMarkersResponse, result: WritableTxnMarkerResult) {
    match resp
        .markers
        .iter_mut()
        .find(|m| m.producer_id == result.producer_id)
    {
        Some(existing) => existing.topics.extend(result.topics),
        None => resp.markers.push(result),
    }
}
