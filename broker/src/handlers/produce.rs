//! Produce (key 0): validate each partition's batch, append as leader,
//! answer per partition. v0-2 are advertised (librdkafka needs to see them,
//! KAFKA-18659) but rejected, as Kafka 4 does.

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::{now_ms, Broker};
use crate::error::PartitionError;
use crate::types::TopicPartition;

/// The first Produce version Kafka 4 accepts.
const MIN_ACCEPTED_VERSION: i16 = 3;

fn partition_error(version: i16, index: i32, err: &PartitionError) -> PartitionProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = index;
    p.error_code = err.code();
    p.base_offset = -1;
    p.log_append_time_ms = -1;
    p.log_start_offset = -1;
    p.error_message = err.message().map(str_bytes);
    // v8+ name the offending records, so a client fails only those and
    // reports the rest of the batch as collateral (as against Kafka).
    if let PartitionError::KeylessRecordsInCompactedTopic { indexes, .. } = err {
        if version >= 8 {
            p.record_errors = indexes
                .iter()
                .map(|&i| {
                    let mut e = BatchIndexAndErrorMessage::default();
                    e.batch_index = i;
                    e.batch_index_error_message = err.message().map(str_bytes);
                    e
                })
                .collect();
            p.error_message = Some(str_bytes(format!(
                "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: {}",
                indexes.len(),
                err
            )));
        }
    }
    p
}

/// Returns `None` for acks=0, which gets no response.
pub async fn handle(broker: &Broker, version: i16, req: ProduceRequest) -> Option<ProduceResponse> {
    let acks = req.acks;
    let now = now_ms();
    let mut resp = ProduceResponse::default();
    let mut appended = false;
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let mut t = TopicProduceResponse::default();
        t.name = topic.name.clone();
        t.topic_id = topic.topic_id;
        for pd in topic.partition_data {
            let result = if version < MIN_ACCEPTED_VERSION {
                Err(PartitionError::UnsupportedVersion)
            } else if !matches!(acks, -1..=1) {
                // INVALID_REQUIRED_ACKS has no PartitionError condition of its
                // own elsewhere; answer it here.
                let mut p = PartitionProduceResponse::default();
                p.index = pd.index;
                p.error_code = ResponseError::InvalidRequiredAcks.code();
                p.base_offset = -1;
                p.log_append_time_ms = -1;
                p.log_start_offset = -1;
                t.partition_responses.push(p);
                continue;
            } else if req.transactional_id.is_some() {
                Err(PartitionError::TransactionsUnsupported)
            } else if name == crate::coordinator::OFFSETS_TOPIC {
                Err(PartitionError::InternalTopic(name.clone()))
            } else {
                let tp = TopicPartition::new(name.as_str(), pd.index);
                match (broker.replicas.get(&tp), pd.records) {
                    (None, _) => Err(PartitionError::UnknownTopicOrPartition),
                    (Some(_), None) => Err(PartitionError::InvalidRecord("null records".into())),
                    (Some(part), Some(records)) => {
                        let size = records.len();
                        let r = part
                            .lock()
                            .expect("poisoned")
                            .append_as_leader(&records, acks, now);
                        if r.is_ok() {
                            appended = true;
                            metrics::counter!("kafka_broker_bytes_in_total", "topic" => name.clone())
                                .increment(size as u64);
                        }
                        r
                    }
                }
            };
            let p = match result {
                Ok(out) => {
                    let mut p = PartitionProduceResponse::default();
                    p.index = pd.index;
                    p.base_offset = out.base_offset.0;
                    p.log_append_time_ms = out.log_append_time_ms;
                    p.log_start_offset = out.log_start_offset.0;
                    p
                }
                Err(e) => {
                    if let PartitionError::Storage(msg) = &e {
                        tracing::error!(topic = %name, partition = pd.index, error = %msg, "append failed");
                    }
                    metrics::counter!("kafka_broker_partition_errors_total", "api" => "Produce", "code" => e.code().to_string())
                        .increment(1);
                    partition_error(version, pd.index, &e)
                }
            };
            t.partition_responses.push(p);
        }
        resp.responses.push(t);
    }
    if appended {
        broker.replicas.appended.notify_waiters();
    }
    if acks == 0 {
        None
    } else {
        Some(resp)
    }
}
