//! Fetch (key 1) for consumers: whole batches from the fetch offset up to the
//! high watermark, within partition and response byte limits, long-polling
//! on `min_bytes` / `max_wait_ms`.
//!
//! Fetch sessions (KIP-227): we always answer session id 0, which tells the
//! client that no session was created, so every request is a full fetch.
//! That is a correct session-less answer; clients fall back to it by design.

use std::time::Duration;

use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::broker::Broker;
use crate::error::PartitionError;
use crate::types::{Offset, TopicPartition};

/// The longest a fetch may wait, whatever the client asks.
const MAX_WAIT_MS_CAP: i32 = 30_000;

pub async fn handle(broker: &Broker, version: i16, req: FetchRequest) -> FetchResponse {
    if req.session_id != 0 {
        let mut resp = FetchResponse::default();
        resp.error_code = ResponseError::FetchSessionIdNotFound.code();
        return resp;
    }
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    loop {
        // Register interest before reading, so an append between the read
        // and the wait still wakes us.
        let notified = broker.replicas.appended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (resp, bytes, had_error) = read_once(broker, version, &req);
        if bytes >= req.min_bytes.max(0) as usize
            || had_error
            || tokio::time::Instant::now() >= deadline
        {
            return account(broker, resp);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            let (resp, _, _) = read_once(broker, version, &req);
            return account(broker, resp);
        }
    }
}

/// Counts bytes out per topic and per-partition errors, then hands the
/// response back.
fn account(broker: &Broker, resp: FetchResponse) -> FetchResponse {
    let image = broker.metadata.image();
    for t in &resp.responses {
        let name = if t.topic.0.is_empty() {
            image
                .topic_by_id(t.topic_id)
                .map(|i| i.name.clone())
                .unwrap_or_default()
        } else {
            t.topic.0.to_string()
        };
        let bytes: usize = t
            .partitions
            .iter()
            .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
            .sum();
        if bytes > 0 {
            metrics::counter!("kafka_broker_bytes_out_total", "topic" => name)
                .increment(bytes as u64);
        }
        for p in t.partitions.iter().filter(|p| p.error_code != 0) {
            metrics::counter!("kafka_broker_partition_errors_total", "api" => "Fetch", "code" => p.error_code.to_string())
                .increment(1);
        }
    }
    resp
}

fn read_once(broker: &Broker, version: i16, req: &FetchRequest) -> (FetchResponse, usize, bool) {
    let mut resp = FetchResponse::default();
    let max_bytes = if req.max_bytes <= 0 {
        i32::MAX
    } else {
        req.max_bytes
    } as usize;
    let mut total = 0usize;
    let mut had_error = false;
    let image = broker.metadata.image();
    for topic in &req.topics {
        let mut t = FetchableTopicResponse::default();
        t.topic_id = topic.topic_id;
        // From v13 topics are named by id only.
        let name: Option<String> = if version >= 13 {
            image.topic_by_id(topic.topic_id).map(|t| t.name.clone())
        } else {
            t.topic = topic.topic.clone();
            Some(topic.topic.0.to_string())
        };
        for fp in &topic.partitions {
            let mut pd = PartitionData::default();
            pd.partition_index = fp.partition;
            pd.high_watermark = -1;
            pd.last_stable_offset = -1;
            pd.log_start_offset = -1;
            pd.preferred_read_replica = kafka_protocol::messages::BrokerId(-1);
            let Some(name) = &name else {
                pd.error_code = ResponseError::UnknownTopicId.code();
                had_error = true;
                t.partitions.push(pd);
                continue;
            };
            let tp = TopicPartition::new(name.as_str(), fp.partition);
            let Some(part) = broker.replicas.get(&tp) else {
                pd.error_code = ResponseError::UnknownTopicOrPartition.code();
                had_error = true;
                t.partitions.push(pd);
                continue;
            };
            let part = part.lock().expect("poisoned");
            let epoch = part.leader_epoch().0;
            if fp.current_leader_epoch >= 0 && fp.current_leader_epoch != epoch {
                pd.error_code = if fp.current_leader_epoch < epoch {
                    ResponseError::FencedLeaderEpoch
                } else {
                    ResponseError::UnknownLeaderEpoch
                }
                .code();
                had_error = true;
                t.partitions.push(pd);
                continue;
            }
            let remaining = max_bytes.saturating_sub(total);
            let partition_max = (fp.partition_max_bytes.max(0) as usize).min(remaining);
            // The first partition with data always returns at least one whole
            // batch, so a batch larger than the limits cannot stall a consumer.
            match part.read(Offset(fp.fetch_offset), partition_max, total == 0) {
                Ok(out) => {
                    pd.high_watermark = out.high_watermark.0;
                    pd.last_stable_offset = out.last_stable_offset.0;
                    pd.log_start_offset = out.log_start_offset.0;
                    pd.aborted_transactions = Some(vec![]);
                    total += out.records.len();
                    pd.records = Some(out.records);
                }
                Err(e) => {
                    if let PartitionError::OffsetOutOfRange { .. } = e {
                        pd.high_watermark = part.high_watermark().0;
                        pd.last_stable_offset = part.high_watermark().0;
                        pd.log_start_offset = part.log_start_offset().0;
                    }
                    pd.error_code = e.code();
                    had_error = true;
                }
            }
            t.partitions.push(pd);
        }
        if version < 13 {
            t.topic = TopicName(str_bytes(topic.topic.0.to_string()));
        }
        resp.responses.push(t);
    }
    (resp, total, had_error)
}
