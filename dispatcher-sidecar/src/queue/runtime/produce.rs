//! Produce: limits, ids, dedupe, delays.

use super::*;

impl QueueRuntime {
    pub(crate) async fn produce(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        validate_produce(&messages, &self.config.retry_tiers)
            .map_err(ServiceError::InvalidArgument)?;
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
            let topic = match m.delay.filter(|d| !d.is_zero()) {
                None => {
                    headers.push((MESSAGE_ID_HEADER.to_owned(), id.clone().into_bytes()));
                    &self.topics[0]
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
                        due_ms: Some(now + ms(delay)),
                        errors: Vec::new(),
                    }
                    .write_into(&mut headers);
                    &self.topics[tier + 1]
                }
            };
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in &headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(v),
                });
            }
            // By key with librdkafka's default partitioner; without a key its
            // sticky partitioner spreads batches over the partitions.
            let mut record = FutureRecord::to(topic)
                .payload(&m.payload[..])
                .headers(owned);
            if let Some(k) = &m.key {
                record = record.key(&k[..]);
            }
            let send = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| e.to_string());
            sends.push((i, id, deduped, send));
        }
        let mut error = None;
        for (i, id, deduped, send) in sends {
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
                    }
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
