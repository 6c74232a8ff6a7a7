//! The producer for retry-tier, DLQ and ack-log writes: `acks=all`,
//! idempotent (see `kafka::producer_config`).

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// One record to write. `partition: None` lets the partitioner choose (by
/// key); the ack log names the partition it mirrors.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

#[derive(Clone)]
pub struct Producer {
    inner: FutureProducer,
    queue_timeout: Duration,
}

impl Producer {
    /// `queue_timeout` bounds how long a send waits for room in librdkafka's
    /// local queue; delivery itself is bounded by `message.timeout.ms`.
    pub fn new(client_config: &ClientConfig, queue_timeout: Duration) -> Result<Self, KafkaError> {
        Ok(Producer {
            inner: client_config.create()?,
            queue_timeout,
        })
    }

    /// Writes one record and waits for its ack: (partition, offset).
    pub async fn send(&self, record: &Record<'_>) -> Result<(i32, i64), KafkaError> {
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: Some(*value),
            });
        }
        let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(record.topic).headers(headers);
        if let Some(p) = record.partition {
            r = r.partition(p);
        }
        if let Some(k) = record.key {
            r = r.key(k);
        }
        if let Some(v) = record.payload {
            r = r.payload(v);
        }
        let delivery = self
            .inner
            .send(r, self.queue_timeout)
            .await
            .map_err(|(e, _)| e)?;
        Ok((delivery.partition, delivery.offset))
    }
}
