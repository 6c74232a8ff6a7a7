//! Ordered queues (issue 8) in the runtime: a keyed primary message's
//! failure that is not dead-lettered is retried in its own partition
//! (`queue::ordered`), its retry record written to the ack log first; a
//! dead-lettered one parks its key, whose later records are copied to the
//! hold topic and acked in the primary; a released key's hold is read back
//! (one copy at a time, from the hold partition of the same number) and
//! delivered under receipts naming `HOLD_TOPIC`.

use super::*;
use crate::lease::{Attempt, Failure, RetryEnvelope};
use crate::queue::ordered::{self, OrderedRecord, RetryRecord};
use crate::queue::partition::SkipRefused;
use crate::service::{ParkedKeyInfo, SkipOutcome, SkipRequest};

impl QueueRuntime {
    /// Whether `failure` of `m` in `part` is retried in place rather than
    /// copied to a retry tier: a keyed message of an ordered queue's primary
    /// topic that is not dead-lettered.
    pub(super) fn retries_in_place(
        &self,
        part: &Partition,
        failure: &Failure,
        m: &Buffered,
    ) -> bool {
        self.config.ordered
            && part.qp.topic == 0
            && m.key.is_some()
            && matches!(failure.route, Route::RetryTier { .. })
    }

    /// Retries `jobs` (failures of ordered keyed messages, marked as being
    /// routed) in place: writes each one's retry record to the ack log and,
    /// once written, makes it leasable again at its due time. A failure
    /// whose record the ack log already holds (found again after a rebuild)
    /// is not written twice.
    pub(super) async fn retry_in_place(
        &self,
        part: &Arc<Partition>,
        jobs: Vec<(Failure, Buffered)>,
    ) {
        let (ring, existing): (u32, Vec<Option<RetryRecord>>) = {
            let state = part.lock();
            let existing = jobs
                .iter()
                .map(|(f, _)| {
                    state
                        .ordered()
                        .and_then(|k| k.retry(f.offset))
                        .filter(|r| r.failed_at_ms == f.at_ms && r.failed_attempt == f.attempt.0)
                        .cloned()
                })
                .collect();
            (state.engine.config().gap_cap, existing)
        };
        let mut records = Vec::with_capacity(jobs.len());
        let mut sends = Vec::with_capacity(jobs.len());
        for ((failure, m), existing) in jobs.iter().zip(existing) {
            if let Some(r) = existing {
                records.push(r);
                sends.push(None);
                continue;
            }
            let consumer = self
                .names
                .lock()
                .unwrap()
                .name(failure.consumer)
                .map(str::to_owned);
            let (envelope, _) = m.failure_copy(
                &self.config.topic,
                part.qp.partition,
                failure.offset,
                failure,
                consumer.as_deref(),
            );
            let record = RetryRecord {
                offset: failure.offset,
                attempt: envelope.attempt.0,
                due_ms: envelope.due_ms.unwrap_or(failure.at_ms),
                failed_attempt: failure.attempt.0,
                failed_at_ms: failure.at_ms,
                origin_topic: envelope.origin_topic,
                origin_partition: envelope.origin_partition,
                origin_offset: envelope.origin_offset,
                first_enqueued_ms: envelope.first_enqueued_ms,
                errors: envelope.errors,
            };
            let r = ordered::encode(part.qp, ring, &OrderedRecord::Retry(record.clone()));
            let pending = self.ack_log.append(
                part.qp.partition,
                vec![super::ack_log::OutRecord {
                    key: r.key,
                    value: Some(r.value),
                }],
            );
            records.push(record);
            sends.push(Some(pending));
        }
        let mut written = Vec::with_capacity(records.len());
        for (record, send) in records.into_iter().zip(sends) {
            let result = match send {
                None => Ok(()),
                Some(pending) => pending.wait().await,
            };
            match result {
                Ok(()) => written.push(Ok(record)),
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, partition = %part.qp,
                        offset = record.offset, "writing a retry-in-place record: {e}");
                    written.push(Err((record.offset, format!("ack log: {e}"))));
                }
            }
        }
        let retried = written.iter().filter(|r| r.is_ok()).count();
        let mut outcomes = Vec::with_capacity(written.len());
        {
            let mut state = part.lock();
            for r in written {
                match r {
                    Ok(record) => {
                        outcomes.push((record.offset, Ok(())));
                        state.retry_in_place(record);
                    }
                    Err((offset, e)) => {
                        outcomes.push((offset, Err(e)));
                        state.route_failed(offset);
                    }
                }
            }
        }
        // Its retry record is this failure's copy: a nack waiting for it
        // answers now.
        for (offset, result) in &outcomes {
            part.copied(*offset, result);
        }
        if retried > 0 {
            metrics::counter!("dispatcher_ordered_retries_in_place_total", "queue" => self.name())
                .increment(retried as u64);
            self.ready.notify_waiters();
        }
    }
}

/// A replayed copy dead-lettered: its key and the copy for the DLQ.
type DeadReplay = (bytes::Bytes, Buffered);

impl QueueRuntime {
    fn is_ordered_primary(&self, part: &Partition) -> bool {
        self.config.ordered && part.qp.topic == 0
    }

    /// Copies the records of parked keys to the hold topic (one per key at
    /// a time, so each key's copies stay in order), then marks them done in
    /// the primary partition, which lets its commit point pass them.
    pub(super) async fn hold(&self, part: &Arc<Partition>) {
        if !self.is_ordered_primary(part) {
            return;
        }
        let topic = self.config.hold_topic();
        let hold_partition = part.qp.partition % self.hold_partitions;
        // Bounded per call; the periodic task carries on.
        for _ in 0..100 {
            let jobs = part.lock().take_holdable();
            if jobs.is_empty() {
                return;
            }
            let sends: Vec<_> = jobs
                .iter()
                .map(|(offset, m)| self.send_hold_copy(&topic, hold_partition, part, *offset, m))
                .collect();
            let mut results = Vec::with_capacity(jobs.len());
            let mut indexed = super::trace::IndexWrites::default();
            for (envelope, send) in sends {
                let result = Self::hold_offset(send).await;
                if let Ok(hold_offset) = result {
                    // The index names the hold copy (written before the
                    // original is done, as for a retry copy).
                    let location = crate::trace::Location {
                        kind: crate::trace::LocationKind::Held,
                        topic: topic.clone(),
                        partition: hold_partition,
                        offset: hold_offset,
                        at_ms: now_ms(),
                    };
                    let entry = crate::trace::IndexEntry::from_envelope(&envelope, location);
                    self.index_send(&mut indexed, &envelope.message_id, &entry);
                }
                results.push(result);
            }
            indexed.wait(&self.config.name).await;
            let mut held = 0u64;
            let pending = {
                let mut state = part.lock();
                for ((offset, _), result) in jobs.iter().zip(&results) {
                    match result {
                        Ok(hold_offset) => {
                            state.held(*offset, *hold_offset);
                            held += 1;
                        }
                        Err(e) => {
                            tracing::warn!(queue = %self.config.name, partition = %part.qp,
                                offset, "writing a hold copy: {e}");
                            state.hold_failed(*offset);
                        }
                    }
                }
                self.write_events(&mut state)
            };
            metrics::counter!("dispatcher_held_total", "queue" => self.name()).increment(held);
            part.space.notify_one();
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
                return;
            }
            if held == 0 {
                return;
            }
        }
    }

    /// Hands the hold copy of the record at `offset` to the producer: key,
    /// payload and headers as they are, the envelope (origin, message id,
    /// attempt and history), and the primary offset in `HELD_FROM_HEADER`.
    fn send_hold_copy(
        &self,
        topic: &str,
        hold_partition: i32,
        part: &Partition,
        offset: i64,
        m: &Buffered,
    ) -> (
        RetryEnvelope,
        Result<DeliveryFuture, rdkafka::error::KafkaError>,
    ) {
        let envelope = m.envelope.clone().unwrap_or_else(|| RetryEnvelope {
            origin_topic: self.config.topic.clone(),
            origin_partition: part.qp.partition,
            origin_offset: offset,
            message_id: m.message_id.clone(),
            attempt: Attempt::FIRST,
            first_enqueued_ms: m.timestamp_ms,
            due_ms: None,
            errors: Vec::new(),
        });
        let mut headers = m.headers.clone();
        envelope.write_into(&mut headers);
        headers.push((
            ordered::HELD_FROM_HEADER.to_owned(),
            offset.to_string().into_bytes(),
        ));
        // The copy carries where the message has been (for a trace).
        headers.push(crate::trace::path_header(
            &m.headers,
            self.here(part.qp, offset, m),
        ));
        let mut record = FutureRecord::to(topic)
            .partition(hold_partition)
            .payload(&m.payload[..])
            .headers(owned_headers(&headers));
        if let Some(k) = &m.key {
            record = record.key(&k[..]);
        }
        (
            envelope,
            self.producer.send_result(record).map_err(|(e, _)| e),
        )
    }

    /// The hold offset a copy was written at.
    async fn hold_offset(
        send: Result<DeliveryFuture, rdkafka::error::KafkaError>,
    ) -> Result<i64, String> {
        match send {
            Ok(f) => match f.await {
                Ok(Ok(d)) => Ok(d.offset),
                Ok(Err((e, _))) => Err(e.to_string()),
                Err(_) => Err("the producer went away".to_string()),
            },
            Err(e) => Err(e.to_string()),
        }
    }

    /// The gap cap for ordered keyed messages (`PartitionState::take_stuck`):
    /// a record retried in place that holds the commit point while the
    /// window is full goes to the hold, its key parked until its due time.
    /// Also releases the keys so parked whose time has come.
    pub(super) async fn hold_stuck(&self, part: &Arc<Partition>) {
        if !self.is_ordered_primary(part) {
            return;
        }
        let stuck = {
            let mut state = part.lock();
            state.auto_release(now_ms());
            state.take_stuck()
        };
        let changed = stuck.is_some() || part.lock().has_ordered_out();
        if let Some((offset, m)) = stuck {
            let topic = self.config.hold_topic();
            let hold_partition = part.qp.partition % self.hold_partitions;
            let (envelope, send) = self.send_hold_copy(&topic, hold_partition, part, offset, &m);
            match Self::hold_offset(send).await {
                Ok(hold_offset) => {
                    let location = crate::trace::Location {
                        kind: crate::trace::LocationKind::Held,
                        topic: topic.clone(),
                        partition: hold_partition,
                        offset: hold_offset,
                        at_ms: now_ms(),
                    };
                    self.record_location(&envelope, location).await;
                    part.lock().stuck_held(offset, hold_offset, now_ms());
                    tracing::info!(queue = %self.config.name, partition = %part.qp, offset,
                        "gap cap: a message retried in place moved to the hold, its key parked until it is due");
                    metrics::counter!("dispatcher_held_total", "queue" => self.name()).increment(1);
                }
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, partition = %part.qp, offset,
                        "writing a stuck message's hold copy: {e}");
                    part.lock().stuck_hold_failed(offset);
                }
            }
        }
        if !changed {
            return;
        }
        let pending = self.write_events(&mut part.lock());
        if let Err(e) = pending.wait().await {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
        }
        self.ready.notify_waiters();
    }

    /// Reads the next hold copy of each released key whose replay wants one.
    pub(super) async fn load_replays(&self, part: &Arc<Partition>) {
        if !self.is_ordered_primary(part) {
            return;
        }
        let wanted = part.lock().replay_wanted();
        for (key, from, last, after) in wanted {
            let readers = Arc::clone(&self.readers);
            let topic = self.config.hold_topic();
            let hold_partition = part.qp.partition % self.hold_partitions;
            let k = key.clone();
            let read = tokio::task::spawn_blocking(move || {
                reader::next_held(
                    &readers.hold.lock().unwrap(),
                    &topic,
                    hold_partition,
                    &k,
                    from,
                    last,
                    after,
                    STATS_TIMEOUT * 2,
                )
            })
            .await;
            let pending = {
                let mut state = part.lock();
                match read {
                    Ok(Ok((found, scanned_to))) => {
                        state.replay_loaded(&key, found, Some(scanned_to))
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(queue = %self.config.name, partition = %part.qp, "reading the hold: {e:#}");
                        state.replay_loaded(&key, None, None);
                    }
                    Err(e) => {
                        tracing::warn!(queue = %self.config.name, partition = %part.qp, "reading the hold: {e}");
                        state.replay_loaded(&key, None, None);
                    }
                }
                self.write_events(&mut state)
            };
            self.ready.notify_waiters();
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
            }
        }
    }

    /// Replayed copies whose lease ran out fail like any lease.
    pub(super) async fn expire_replays(&self, part: &Arc<Partition>) {
        if !self.is_ordered_primary(part) {
            return;
        }
        let now = now_ms();
        let (dead, pending) = {
            let mut state = part.lock();
            let expired = state.replay_expired(now);
            if expired.is_empty() {
                return;
            }
            let mut dead = Vec::new();
            for (key, slot) in expired {
                let name = self.names.lock().unwrap().name(slot).map(str::to_owned);
                if let Some(copy) = state.replay_fail(
                    &key,
                    FailureCause::Expired,
                    0,
                    "lease expired",
                    name.as_deref(),
                    now,
                ) {
                    dead.push((key, copy));
                }
            }
            (dead, self.write_events(&mut state))
        };
        if let Err(e) = pending.wait().await {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
        }
        // Not a request: a failed copy is leasable again, and its lease
        // runs out again.
        let _ = self.replay_to_dlq(part, dead).await;
        self.ready.notify_waiters();
    }

    /// Nacks a replayed copy (its receipt names the hold topic).
    pub(super) async fn replay_nack(
        &self,
        part: &Arc<Partition>,
        receipt: &Receipt,
        request: &NackRequest,
    ) -> Result<ReceiptOutcome, ServiceError> {
        let now = now_ms();
        let (dead, pending) = {
            let mut state = part.lock();
            let (key, slot) = match state.replay_key(receipt) {
                Ok(found) => found,
                Err(e) => return Ok(self.stale(&e)),
            };
            let name = self.names.lock().unwrap().name(slot).map(str::to_owned);
            let cause = if request.permanent {
                FailureCause::Permanent
            } else {
                FailureCause::Nacked
            };
            let dead = state.replay_fail(
                &key,
                cause,
                request.retry_after.map_or(0, ms),
                request.error.as_deref().unwrap_or("nacked"),
                name.as_deref(),
                now,
            );
            (
                dead.map(|copy| vec![(key, copy)]).unwrap_or_default(),
                self.write_events(&mut state),
            )
        };
        pending
            .wait()
            .await
            .map_err(|e| unavailable(format!("ack log: {e}")))?;
        let copied = self.replay_to_dlq(part, dead).await;
        self.ready.notify_waiters();
        // The contract: a nack that dead-letters answers once its DLQ copy
        // is acknowledged (a retry's record was awaited above).
        copied.map_err(|e| {
            unavailable(format!(
                "the DLQ copy was not written ({e}); the message is delivered again"
            ))
        })?;
        metrics::counter!("dispatcher_nacks_total", "queue" => self.name()).increment(1);
        Ok(ReceiptOutcome::Ok)
    }

    /// Writes the DLQ copies of dead-lettered replayed copies; each key is
    /// parked again by its copy (the rest of its hold waits). Returns the
    /// first write that failed (that copy is leasable again).
    async fn replay_to_dlq(
        &self,
        part: &Arc<Partition>,
        dead: Vec<DeadReplay>,
    ) -> Result<(), String> {
        if dead.is_empty() {
            return Ok(());
        }
        let mut results = Vec::with_capacity(dead.len());
        for (_, copy) in &dead {
            let mut record = FutureRecord::to(&self.config.dlq_topic)
                .partition(part.qp.partition % self.dlq_partitions)
                .payload(&copy.payload[..])
                .headers(owned_headers(&copy.headers));
            if let Some(k) = &copy.key {
                record = record.key(&k[..]);
            }
            let result = match self.producer.send_result(record) {
                Ok(f) => match f.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err((e, _)) => Err(e.to_string()),
            };
            results.push(result);
        }
        let now = now_ms();
        let mut dead_lettered = 0u64;
        let mut failed = None;
        let pending = {
            let mut state = part.lock();
            for ((key, _), result) in dead.iter().zip(results) {
                match result {
                    Ok(()) => {
                        state.replay_dead_lettered(key, now);
                        dead_lettered += 1;
                    }
                    Err(e) => {
                        tracing::warn!(queue = %self.config.name, partition = %part.qp,
                            "writing a replayed copy's DLQ copy: {e}");
                        state.replay_dlq_failed(key);
                        failed.get_or_insert(e);
                    }
                }
            }
            self.write_events(&mut state)
        };
        metrics::counter!("dispatcher_dead_lettered_total", "queue" => self.name())
            .increment(dead_lettered);
        if let Err(e) = pending.wait().await {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
        }
        failed.map_or(Ok(()), Err)
    }

    /// The parked keys of the primary partitions this instance owns.
    pub(crate) fn parked(&self) -> Result<Vec<ParkedKeyInfo>, ServiceError> {
        if !self.config.ordered {
            return Err(ServiceError::InvalidArgument(format!(
                "queue {:?} is not ordered: it parks no keys",
                self.config.name
            )));
        }
        let mut out = Vec::new();
        for part in self.owned().iter().filter(|p| p.qp.topic == 0) {
            let keys = part.lock().parked_keys();
            out.extend(keys.into_iter().map(|p| ParkedKeyInfo {
                partition: part.qp.partition,
                key: p.key,
                message_id: p.message_id,
                parked_at_ms: p.parked_at_ms,
                held: p.held,
                released_by: p.release.map(|r| r.by),
            }));
        }
        Ok(out)
    }

    /// Releases a parked key without a redrive (its DLQ record stays).
    pub(crate) async fn skip(&self, request: SkipRequest) -> Result<SkipOutcome, ServiceError> {
        if !self.config.ordered {
            return Err(ServiceError::InvalidArgument(format!(
                "queue {:?} is not ordered: it parks no keys",
                self.config.name
            )));
        }
        let partitions = self.topic_partitions[0];
        if request.partition < 0 || request.partition >= partitions {
            return Err(ServiceError::InvalidArgument(format!(
                "partition {} does not exist (the topic has {partitions})",
                request.partition
            )));
        }
        let Some(part) = self.partition(QueuePartition {
            topic: 0,
            partition: request.partition,
        }) else {
            return Ok(SkipOutcome::NotOwner);
        };
        let key = bytes::Bytes::from(request.key);
        let pending = {
            let mut state = part.lock();
            match state.skip(&key, &request.message_id, now_ms()) {
                Ok(()) => self.write_events(&mut state),
                Err(SkipRefused::NotParked) => return Ok(SkipOutcome::NotParked),
                Err(SkipRefused::OtherMessage(_)) => return Ok(SkipOutcome::OtherMessage),
                Err(SkipRefused::Released) => return Ok(SkipOutcome::AlreadyReleased),
            }
        };
        pending
            .wait()
            .await
            .map_err(|e| unavailable(format!("ack log: {e}")))?;
        metrics::counter!("dispatcher_skips_total", "queue" => self.name()).increment(1);
        self.ready.notify_waiters();
        Ok(SkipOutcome::Released)
    }

    /// Parked keys and held copies of the owned primary partitions.
    pub(super) fn ordered_gauges(&self, owned: &[Arc<Partition>]) {
        if !self.config.ordered {
            return;
        }
        let (mut parked, mut held) = (0usize, 0u64);
        for part in owned.iter().filter(|p| p.qp.topic == 0) {
            let state = part.lock();
            if let Some(keys) = state.ordered() {
                parked += keys.parked().count();
                held += keys.held_count();
            }
        }
        metrics::gauge!("dispatcher_parked_keys", "queue" => self.name()).set(parked as f64);
        metrics::gauge!("dispatcher_held_messages", "queue" => self.name()).set(held as f64);
    }
}
