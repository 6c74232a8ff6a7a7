//! Receive, ack, nack and extend.

use super::*;

impl QueueRuntime {
    pub(crate) async fn receive(
        &self,
        request: ReceiveRequest,
    ) -> Result<Vec<Delivery>, ServiceError> {
        if request.max_messages == 0 || request.max_messages > MAX_RECEIVE_MESSAGES {
            return Err(ServiceError::InvalidArgument(format!(
                "max_messages must be 1 to {MAX_RECEIVE_MESSAGES}"
            )));
        }
        if request.wait > MAX_RECEIVE_WAIT {
            return Err(ServiceError::InvalidArgument(format!(
                "wait_seconds must be at most {}",
                MAX_RECEIVE_WAIT.as_secs()
            )));
        }
        if request
            .consumer
            .as_ref()
            .is_some_and(|c| c.len() > MAX_CONSUMER_ID_BYTES)
        {
            return Err(ServiceError::InvalidArgument(format!(
                "consumer must be at most {MAX_CONSUMER_ID_BYTES} bytes"
            )));
        }
        let lease_ms = ms(request
            .lease
            .unwrap_or(self.config.lease)
            .min(self.config.max_lease))
        .max(1);
        let slot = self.names.lock().unwrap().slot(request.consumer.as_deref());
        let max = request.max_messages as usize;
        let deadline = tokio::time::Instant::now() + request.wait;
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Paused: nothing is leased, and a long poll waits for the
            // resume (which notifies `ready`) or its end.
            let (deliveries, pending, next_due_ms) = if self.paused() {
                (Vec::new(), Pending::default(), None)
            } else {
                // The instance's in-flight budget, shared fairly by the
                // queues: when it is spent this waits for its turn.
                let granted = self.fair.acquire(self.lane, max, deadline).await;
                if granted == 0 {
                    return Ok(Vec::new());
                }
                let leased = self.try_lease(granted, slot, lease_ms);
                self.fair.release(granted);
                leased
            };
            if !deliveries.is_empty() {
                // Not awaited: a lease lost with this owner only means a
                // redelivery, and the ownership's generation (written at the
                // rebuild) keeps its receipt stale at the next owner.
                self.watch_lease_writes(pending);
                self.count_deliveries(&deliveries);
                return Ok(deliveries.into_iter().map(|(d, _)| d).collect());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let wake = next_due_ms
                .map(|due| now + Duration::from_millis(u64::try_from(due - now_ms()).unwrap_or(0)))
                .map_or(deadline, |t| t.min(deadline));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Logs and counts a failed write of lease events, which nobody waits for.
    fn watch_lease_writes(&self, pending: Pending) {
        let name = self.name();
        tokio::spawn(async move {
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %name, "ack log: writing lease events failed: {e}");
                metrics::counter!("dispatcher_lease_write_errors_total", "queue" => name)
                    .increment(1);
            }
        });
    }

    fn count_deliveries(&self, deliveries: &[(Delivery, bool)]) {
        let name = self.name();
        metrics::counter!("dispatcher_receives_total", "queue" => name.clone())
            .increment(deliveries.len() as u64);
        let redelivered = deliveries
            .iter()
            .filter(|(d, crashed)| d.attempt > 1 || *crashed)
            .count();
        if redelivered > 0 {
            metrics::counter!("dispatcher_redeliveries_total", "queue" => name.clone())
                .increment(redelivered as u64);
        }
        let h = metrics::histogram!("dispatcher_delivery_attempts", "queue" => name);
        for (d, _) in deliveries {
            h.record(f64::from(d.attempt));
        }
    }

    /// One pass over the owned partitions (from a rotating start, so no
    /// partition starves): leases up to `max` records. Returns the
    /// deliveries (with whether each re-delivers a crashed lease), their
    /// ack-log writes, and the earliest due time of a waiting tier record.
    fn try_lease(
        &self,
        max: usize,
        slot: crate::lease::ConsumerSlot,
        lease_ms: i64,
    ) -> (Vec<(Delivery, bool)>, Pending, Option<i64>) {
        let parts = self.owned();
        let mut deliveries = Vec::with_capacity(max);
        let mut pending = Pending::default();
        let mut next_due: Option<i64> = None;
        if parts.is_empty() {
            return (deliveries, pending, None);
        }
        let start = self.rr.fetch_add(1, Ordering::Relaxed) % parts.len();
        let now = now_ms();
        for i in 0..parts.len() {
            if deliveries.len() >= max {
                break;
            }
            let part = &parts[(start + i) % parts.len()];
            let mut state = part.lock();
            let grants = state.lease(max - deliveries.len(), slot, lease_ms, now);
            let leased = !grants.is_empty();
            for (grant, m, crashed) in grants {
                let (partition, offset) = match m.origin(part.qp.partition, grant.receipt.offset) {
                    (_, o) if o < 0 => (part.qp.partition, grant.receipt.offset),
                    origin => origin,
                };
                deliveries.push((
                    Delivery {
                        message_id: m.message_id.clone(),
                        receipt: self.codec.encode(&grant.receipt),
                        key: m.key.clone(),
                        payload: m.payload.clone(),
                        headers: m.user_headers(),
                        attempt: u32::from(grant.attempt.0),
                        enqueued_at_ms: m.enqueued_at_ms(),
                        partition,
                        offset,
                        lease_expires_at_ms: grant.expiry_ms,
                    },
                    crashed,
                ));
            }
            if leased {
                pending.merge(self.write_events(&mut state));
                part.space.notify_one();
            }
            if let Some(due) = state.next_due_ms(now) {
                next_due = Some(next_due.map_or(due, |d: i64| d.min(due)));
            }
        }
        (deliveries, pending, next_due)
    }

    // ---- ack, nack, extend -----------------------------------------------

    /// Decodes a receipt and finds its partition: the outcome when it is
    /// not ours to apply.
    fn resolve(&self, text: &str) -> Result<(Receipt, Arc<Partition>), ReceiptOutcome> {
        let receipt = match self.codec.decode(text) {
            Ok(r) => r,
            Err(_) => {
                metrics::counter!("dispatcher_invalid_receipts_total", "queue" => self.name())
                    .increment(1);
                return Err(ReceiptOutcome::Invalid);
            }
        };
        // A replayed hold copy (ordered queues) is served by the owner of
        // the primary partition of the same number.
        let owner = if receipt.partition.topic == crate::queue::ordered::HOLD_TOPIC {
            QueuePartition {
                topic: 0,
                partition: receipt.partition.partition,
            }
        } else {
            receipt.partition
        };
        match self.partition(owner) {
            Some(p) => Ok((receipt, p)),
            None => Err(ReceiptOutcome::NotOwner),
        }
    }

    pub(super) fn stale(&self, e: &LeaseError) -> ReceiptOutcome {
        if matches!(
            e,
            LeaseError::StaleReceipt { .. } | LeaseError::StaleGeneration { .. }
        ) {
            metrics::counter!("dispatcher_stale_receipts_total", "queue" => self.name())
                .increment(1);
            ReceiptOutcome::Stale
        } else {
            ReceiptOutcome::NotOwner
        }
    }

    pub(crate) async fn ack(
        &self,
        receipts: &[String],
    ) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        if receipts.len() > MAX_ACK_RECEIPTS {
            return Err(ServiceError::InvalidArgument(format!(
                "at most {MAX_ACK_RECEIPTS} receipts in one ack"
            )));
        }
        let mut outcomes = vec![ReceiptOutcome::Invalid; receipts.len()];
        let mut by_partition: BTreeMap<QueuePartition, ReceiptsOf> = BTreeMap::new();
        for (i, text) in receipts.iter().enumerate() {
            match self.resolve(text) {
                Ok((r, part)) => by_partition
                    .entry(r.partition)
                    .or_insert_with(|| (part, Vec::new()))
                    .1
                    .push((i, r)),
                Err(outcome) => outcomes[i] = outcome,
            }
        }
        let mut pending = Pending::default();
        let mut wake = false;
        for (part, list) in by_partition.values() {
            let mut state = part.lock();
            for (i, r) in list {
                let acked = if r.partition.topic == crate::queue::ordered::HOLD_TOPIC {
                    state.replay_ack(r)
                } else {
                    state.engine.ack(r).map(|()| state.done(r.offset))
                };
                outcomes[*i] = match acked {
                    Ok(()) => ReceiptOutcome::Ok,
                    Err(e) => self.stale(&e),
                };
            }
            pending.merge(self.write_events(&mut state));
            part.space.notify_one();
            wake |= state.ready_len() > 0;
        }
        if wake {
            // The commit point may have moved: records held back by the gap
            // cap can be leased now.
            self.ready.notify_waiters();
        }
        // How long the ack waits for Kafka: the part of its latency the
        // dispatcher does not control (docs/operations.md). Recorded for a
        // failed write too: a leader that times out is the slowest case.
        let waiting = std::time::Instant::now();
        let written = pending.wait().await;
        metrics::histogram!("dispatcher_ack_log_write_seconds", "queue" => self.name())
            .record(waiting.elapsed().as_secs_f64());
        written.map_err(|e| unavailable(format!("ack log: {e}")))?;
        // Ordered queues: a replayed copy acked, read the key's next one now
        // rather than at the next tick.
        for (qp, (part, _)) in &by_partition {
            if qp.topic == crate::queue::ordered::HOLD_TOPIC {
                self.load_replays(part).await;
            }
        }
        let acked = outcomes
            .iter()
            .filter(|o| **o == ReceiptOutcome::Ok)
            .count();
        metrics::counter!("dispatcher_acks_total", "queue" => self.name()).increment(acked as u64);
        Ok(outcomes)
    }

    pub(crate) async fn nack(&self, request: NackRequest) -> Result<ReceiptOutcome, ServiceError> {
        let (receipt, part) = match self.resolve(&request.receipt) {
            Ok(found) => found,
            Err(outcome) => return Ok(outcome),
        };
        if receipt.partition.topic == crate::queue::ordered::HOLD_TOPIC {
            return self.replay_nack(&part, &receipt, &request).await;
        }
        let retry_after_ms = request.retry_after.map(ms);
        let error = request.error.as_deref().unwrap_or("nacked");
        let (pending, copied, route) = {
            let mut state = part.lock();
            match state.engine.nack(
                &receipt,
                retry_after_ms,
                error,
                request.permanent,
                now_ms_ceil(),
            ) {
                Ok(failure) => {
                    // Before the failure is visible to any routing task
                    // (the periodic one or a fetch may write its copy).
                    let copied = part.wait_for_copy(failure.offset);
                    let route = failure.route;
                    state.fail(failure);
                    (self.write_events(&mut state), copied, route)
                }
                Err(e) => return Ok(self.stale(&e)),
            }
        };
        pending
            .wait()
            .await
            .map_err(|e| unavailable(format!("ack log: {e}")))?;
        self.route(&part).await;
        // The contract: a nack answers once its copy is acknowledged.
        let to = match route {
            Route::Dlq => "the DLQ",
            Route::RetryTier { .. } => "its retry tier",
        };
        match tokio::time::timeout(KAFKA_TIMEOUT, copied).await {
            Ok(Ok(Ok(()))) => {
                metrics::counter!("dispatcher_nacks_total", "queue" => self.name()).increment(1);
                Ok(ReceiptOutcome::Ok)
            }
            Ok(Ok(Err(e))) => Err(unavailable(format!(
                "the nack is recorded, but its copy to {to} was not written ({e}); the \
                 dispatcher writes it again, the message is not lost"
            ))),
            Ok(Err(_)) => Err(unavailable(format!(
                "the nack is recorded, but the partition moved before its copy to {to} was \
                 written; its new owner writes it"
            ))),
            Err(_) => Err(unavailable(format!(
                "the nack is recorded, but its copy to {to} was not acknowledged within \
                 {KAFKA_TIMEOUT:?}; the dispatcher goes on writing it"
            ))),
        }
    }

    pub(crate) async fn extend(
        &self,
        receipt: String,
        lease: Duration,
    ) -> Result<ExtendResult, ServiceError> {
        let (receipt, part) = match self.resolve(&receipt) {
            Ok(found) => found,
            Err(outcome) => {
                return Ok(ExtendResult {
                    outcome,
                    lease_expires_at_ms: None,
                });
            }
        };
        let result = {
            let mut state = part.lock();
            if receipt.partition.topic == crate::queue::ordered::HOLD_TOPIC {
                state.replay_extend(&receipt, ms(lease), now_ms())
            } else {
                state.engine.extend(&receipt, ms(lease), now_ms())
            }
        };
        Ok(match result {
            Ok(extended) => ExtendResult {
                outcome: ReceiptOutcome::Ok,
                lease_expires_at_ms: Some(extended.expiry_ms),
            },
            Err(e) => ExtendResult {
                outcome: self.stale(&e),
                lease_expires_at_ms: None,
            },
        })
    }
}
