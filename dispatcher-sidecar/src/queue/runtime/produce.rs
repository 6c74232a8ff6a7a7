//! Produce: limits, ids, dedupe, delays.
//!
//! Dedupe spans restarts and instances through the queue's dedupe topic
//! (`kafka::dedupe_log`): every accepted id is written there before the
//! produce answers, and every instance reads the topic's last window at start
//! and follows it.

use super::*;

use anyhow::Context as _;

use crate::kafka::dedupe_log;

use super::trace;

impl QueueRuntime {
    /// Loads the dedupe window from the dedupe topic, then keeps following
    /// it (ids accepted by other instances). Called once, at start.
    pub(crate) async fn follow_dedupe(
        &self,
        reader_config: &rdkafka::config::ClientConfig,
    ) -> anyhow::Result<()> {
        let client_config = reader_config
            .clone()
            .set("client.id", "dispatcher-dedupe-reader")
            .clone();
        let topic = self.config.dedupe_topic.clone();
        let window = self.config.dedupe_window;
        let dedupe = self.dedupe.clone();
        let follower = tokio::task::spawn_blocking(move || {
            dedupe_log::follow(&client_config, &topic, window, move |(id, p, o, at)| {
                dedupe.lock().unwrap().record(id, p, o, at)
            })
        })
        .await
        .expect("the dedupe reader does not panic")
        .with_context(|| format!("queue {:?}: reading the dedupe topic", self.config.name))?;
        *self.dedupe_follower.lock().unwrap() = Some(follower);
        Ok(())
    }

    /// Stops following the dedupe topic (at shutdown).
    pub(crate) fn stop_dedupe(&self) {
        let follower = self.dedupe_follower.lock().unwrap().take();
        drop(follower);
    }

    pub(crate) async fn produce(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        validate_produce(&messages, &self.config.retry_tiers)
            .map_err(ServiceError::InvalidArgument)?;
        if self.config.ordered {
            // A delayed message waits in a retry tier, outside its key's
            // partition: it could not keep its place in the key's order.
            if let Some(i) = messages
                .iter()
                .position(|m| m.key.is_some() && m.delay.is_some())
            {
                return Err(ServiceError::InvalidArgument(format!(
                    "messages[{i}]: a keyed message of an ordered queue cannot be delayed \
                     (it would leave its key's order); drop delay_seconds or the key"
                )));
            }
        }
        let now = now_ms();
        let mut results: Vec<Option<ProduceResult>> = vec![None; messages.len()];
        // (index, id, deduped, the send)
        let mut sends = Vec::new();
        // An id given twice in one request: the later ones answer as
        // duplicates of the first.
        let mut first_of: HashMap<String, usize> = HashMap::new();
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        for (i, m) in messages.into_iter().enumerate() {
            let deduped = m.message_id.is_some();
            let id = m
                .message_id
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            if deduped {
                if let Some(&first) = first_of.get(&id) {
                    repeats.push((i, first));
                    continue;
                }
                first_of.insert(id.clone(), i);
                if let Some((partition, offset)) =
                    self.dedupe.lock().unwrap().check_and_insert(&id, now)
                {
                    results[i] = Some(ProduceResult {
                        message_id: id,
                        status: ProduceStatus::Duplicate,
                        partition,
                        offset,
                    });
                    continue;
                }
            }
            let mut headers = m.headers;
            let (t, topic) = match m.delay.filter(|d| !d.is_zero()) {
                None => {
                    headers.push((MESSAGE_ID_HEADER.to_owned(), id.clone().into_bytes()));
                    (0, &self.topics[0])
                }
                Some(delay) => {
                    let tier = tier_for_delay(&self.config.retry_tiers, delay).expect("validated");
                    crate::lease::RetryEnvelope {
                        origin_topic: self.config.topic.clone(),
                        origin_partition: -1,
                        origin_offset: -1,
                        message_id: id.clone(),
                        attempt: crate::lease::Attempt::FIRST,
                        first_enqueued_ms: now,
                        due_ms: Some(now_ms_ceil() + ms(delay)),
                        errors: Vec::new(),
                    }
                    .write_into(&mut headers);
                    (tier + 1, &self.topics[tier + 1])
                }
            };
            // By key with the producer's partitioner (murmur2, as Java
            // clients, unless `[librdkafka]` names another); without a key its
            // sticky partitioner spreads batches over the partitions.
            let mut record = FutureRecord::to(topic)
                .payload(&m.payload[..])
                .headers(owned_headers(&headers));
            if let Some(k) = &m.key {
                record = record.key(&k[..]);
            }
            let send = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| e.to_string());
            sends.push((i, id, deduped, t, send));
        }
        let mut error = None;
        let mut remembered = Pending::default();
        let mut indexed = trace::IndexWrites::default();
        for (i, id, deduped, t, send) in sends {
            let outcome = match send {
                Ok(f) => match f.await {
                    Ok(Ok(d)) => Ok((d.partition, d.offset)),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e),
            };
            match outcome {
                Ok((partition, offset)) => {
                    if deduped {
                        self.dedupe
                            .lock()
                            .unwrap()
                            .record(&id, partition, offset, now);
                        let value = dedupe_log::encode_value(partition, offset);
                        let record = FutureRecord::to(&self.config.dedupe_topic)
                            .key(id.as_bytes())
                            .payload(&value[..]);
                        remembered.sent(self.producer.send_result(record));
                    }
                    self.index_send(
                        &mut indexed,
                        &id,
                        &self.produced_entry(t, partition, offset, now),
                    );
                    results[i] = Some(ProduceResult {
                        message_id: id,
                        status: ProduceStatus::Accepted,
                        partition,
                        offset,
                    });
                }
                Err(e) => {
                    if deduped {
                        self.dedupe.lock().unwrap().forget(&id);
                    }
                    error.get_or_insert(e);
                }
            }
        }
        // The ids are durable before the answer, so a restart (or another
        // instance) still answers a retry `duplicate`. A failure here leaves
        // the messages accepted: a retry may then write a second copy
        // (at least once), never lose one.
        // The index is written beside the dedupe ids; a failure there is
        // counted, and the produce stands (see `trace::IndexWrites`).
        let (remembered, ()) = tokio::join!(remembered.wait(), indexed.wait(&self.config.name));
        if let Err(e) = remembered {
            tracing::warn!(queue = %self.config.name, "writing to the dedupe topic: {e}");
        }
        for (i, first) in repeats {
            results[i] = results[first].clone().map(|r| ProduceResult {
                status: ProduceStatus::Duplicate,
                ..r
            });
        }
        let results: Vec<ProduceResult> = results.into_iter().flatten().collect();
        let accepted = results
            .iter()
            .filter(|r| r.status == ProduceStatus::Accepted)
            .count();
        let name = self.name();
        metrics::counter!("dispatcher_produced_total", "queue" => name.clone(), "status" => "accepted")
            .increment(accepted as u64);
        metrics::counter!("dispatcher_produced_total", "queue" => name, "status" => "duplicate")
            .increment((results.len() - accepted) as u64);
        match error {
            // The ones written are recorded: a retry of the request answers
            // them `duplicate` (when they carry ids) and writes the rest.
            Some(e) => Err(unavailable(format!("produce: {e}"))),
            None => Ok(results),
        }
    }
}
