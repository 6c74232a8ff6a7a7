//! Failures: copies to a retry tier or the DLQ, and the periodic work
//! (expiry, the gap cap, commits, retention accounting, gauges).

use super::*;

impl QueueRuntime {
    /// Writes the copies of the partition's failures (retry tier or DLQ),
    /// and once each copy is acknowledged, marks its offset done.
    pub(super) async fn route(&self, part: &Arc<Partition>) {
        let jobs = part.lock().take_routable();
        let (in_place, jobs): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|(failure, m)| self.retries_in_place(part, failure, m));
        if !in_place.is_empty() {
            self.retry_in_place(part, in_place).await;
        }
        if jobs.is_empty() {
            return;
        }
        let mut sends = Vec::with_capacity(jobs.len());
        for (failure, m) in &jobs {
            let consumer = self
                .names
                .lock()
                .unwrap()
                .name(failure.consumer)
                .map(str::to_owned);
            let (envelope, mut headers) = m.failure_copy(
                &self.config.topic,
                part.qp.partition,
                failure.offset,
                failure,
                consumer.as_deref(),
            );
            // The copy carries where the message has been (for a trace).
            headers.push(crate::trace::path_header(
                &m.headers,
                self.here(part.qp, failure.offset, m),
            ));
            let (topic, partitions, kind) = match failure.route {
                Route::Dlq => (
                    &self.config.dlq_topic,
                    self.dlq_partitions,
                    crate::trace::LocationKind::Dlq,
                ),
                Route::RetryTier { tier, .. } => (
                    &self.topics[tier + 1],
                    self.topic_partitions[tier + 1],
                    crate::trace::LocationKind::Retry,
                ),
            };
            let mut record = FutureRecord::to(topic)
                .partition(part.qp.partition % partitions.max(1))
                .payload(&m.payload[..])
                .headers(owned_headers(&headers));
            if let Some(k) = &m.key {
                record = record.key(&k[..]);
            }
            sends.push((
                self.producer.send_result(record).map_err(|(e, _)| e),
                envelope,
                topic.clone(),
                kind,
            ));
        }
        let mut ok = Vec::new();
        let mut results = Vec::with_capacity(jobs.len());
        let mut dead_lettered = 0u64;
        let mut parked_overflow = 0u64;
        let mut indexed = super::trace::IndexWrites::default();
        for ((failure, _), (send, envelope, topic, kind)) in jobs.iter().zip(sends) {
            let result = match send {
                Ok(f) => match f.await {
                    Ok(Ok(d)) => {
                        // The index names the copy before the original is
                        // done (awaited below): a crash between the two
                        // routes the failure again, and writes both again.
                        let location = crate::trace::Location {
                            kind,
                            topic,
                            partition: d.partition,
                            offset: d.offset,
                            at_ms: d.timestamp.to_millis().unwrap_or_else(now_ms),
                        };
                        let entry = crate::trace::IndexEntry::from_envelope(&envelope, location);
                        self.index_send(&mut indexed, &envelope.message_id, &entry);
                        Ok(())
                    }
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            match &result {
                Ok(()) => {
                    if failure.route == Route::Dlq {
                        dead_lettered += 1;
                    }
                    ok.push(failure.offset);
                }
                Err(e) => tracing::warn!(queue = %self.config.name, partition = %part.qp,
                    offset = failure.offset, "writing the failure copy: {e}"),
            }
            results.push(result);
        }
        indexed.wait(&self.config.name).await;
        let (pending, wake) = {
            let mut state = part.lock();
            for (failure, m) in &jobs {
                if ok.contains(&failure.offset) {
                    state.routed(failure.offset);
                    // Ordered queues: a dead-lettered key is parked.
                    if let (true, Route::Dlq, Some(key)) = (
                        self.config.ordered && part.qp.topic == 0,
                        failure.route,
                        &m.key,
                    ) {
                        if !state.park(key, &m.message_id, now_ms()) {
                            parked_overflow += 1;
                        }
                    }
                } else {
                    state.route_failed(failure.offset);
                }
            }
            (self.write_events(&mut state), state.ready_len() > 0)
        };
        // The copies are acknowledged (or failed): the nacks waiting for
        // them answer. The done events above need not be: a crash before
        // they are written routes the failure again (a second copy).
        for ((failure, _), result) in jobs.iter().zip(&results) {
            part.copied(failure.offset, result);
        }
        part.space.notify_one();
        if wake {
            self.ready.notify_waiters();
        }
        if dead_lettered > 0 {
            metrics::counter!("dispatcher_dead_lettered_total", "queue" => self.name())
                .increment(dead_lettered);
        }
        if parked_overflow > 0 {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, parked_overflow,
                "the table of parked keys is full: dead-lettered keys not parked");
            metrics::counter!("dispatcher_parked_overflow_total", "queue" => self.name())
                .increment(parked_overflow);
        }
        if let Err(e) = pending.wait().await {
            tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
        }
    }

    /// The periodic work: expire leases, enforce the gap cap, route
    /// failures; with `slow` also commit, account records that left
    /// retention, and update the gauges.
    pub(crate) async fn tick(self: &Arc<Self>, slow: bool, measure: bool) {
        let now = now_ms();
        for part in self.owned() {
            let (pending, expired, routable) = {
                let mut state = part.lock();
                let mut failures = state.engine.expire(now);
                failures.extend(state.engine.enforce_gap_cap(now));
                let expired = failures
                    .iter()
                    .filter(|f| f.cause == FailureCause::Expired)
                    .count();
                for f in failures {
                    state.fail(f);
                }
                (self.write_events(&mut state), expired, state.has_routable())
            };
            if expired > 0 {
                metrics::counter!("dispatcher_lease_expiries_total", "queue" => self.name())
                    .increment(expired as u64);
            }
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
                continue;
            }
            if routable {
                self.route(&part).await;
            }
            self.expire_replays(&part).await;
            self.hold_stuck(&part).await;
            self.hold(&part).await;
            self.load_replays(&part).await;
        }
        if slow {
            let owned = self.owned();
            self.commit(&owned, false).await;
            self.repair().await;
        }
        if measure {
            let owned = self.owned();
            match self.measure().await {
                Ok(measure) => {
                    self.account_retention(&owned, &measure).await;
                    self.set_gauges(&owned, &measure);
                }
                Err(e) => tracing::warn!(queue = %self.config.name, "stats: {e}"),
            }
        }
    }

    /// Records below the log start offset left retention before being done:
    /// counted, and the commit point moves past them.
    async fn account_retention(&self, owned: &[Arc<Partition>], measure: &Measure) {
        for part in owned.iter().filter(|p| p.qp.topic == 0) {
            let Some(&(low, _)) = measure.watermarks.get(&part.qp) else {
                continue;
            };
            let (lost, pending) = {
                let mut state = part.lock();
                let lost = state.left_retention(low);
                (lost, self.write_events(&mut state))
            };
            if lost > 0 {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, lost,
                    "records left retention before being acked");
                metrics::counter!("dispatcher_expired_unprocessed_total", "queue" => self.name(),
                    "partition" => part.qp.partition.to_string())
                .increment(lost as u64);
            }
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
            }
        }
    }

    fn set_gauges(&self, owned: &[Arc<Partition>], measure: &Measure) {
        self.ordered_gauges(owned);
        let now = now_ms();
        let name = self.name();
        let mut retry_depth = vec![0i64; self.topics.len()];
        for part in owned {
            let (in_flight, committed, oldest) = {
                let s = part.lock();
                (
                    s.engine.in_flight_len(),
                    s.engine.committed_offset(),
                    s.oldest_timestamp_ms(),
                )
            };
            let label = self.label(part.qp);
            metrics::gauge!("dispatcher_in_flight", "queue" => name.clone(), "partition" => label.clone())
                .set(in_flight as f64);
            let stuck = part.fetch_health.lock().unwrap().stuck(now).is_some();
            metrics::gauge!("dispatcher_partition_stuck", "queue" => name.clone(), "partition" => label.clone())
                .set(if stuck { 1.0 } else { 0.0 });
            if part.qp.topic == 0 {
                let age = oldest.map_or(0, |ts| (now - ts).max(0));
                metrics::gauge!("dispatcher_oldest_unacked_age_seconds", "queue" => name.clone(), "partition" => label)
                    .set(age as f64 / 1000.0);
            } else if let Some(&(_, high)) = measure.watermarks.get(&part.qp) {
                retry_depth[usize::from(part.qp.topic)] += (high - committed).max(0);
            }
        }
        for (i, tier) in self.config.retry_tiers.iter().enumerate() {
            metrics::gauge!("dispatcher_retry_depth", "queue" => name.clone(), "tier" => format_duration(*tier))
                .set(retry_depth[i + 1] as f64);
        }
        metrics::gauge!("dispatcher_dlq_depth", "queue" => name.clone())
            .set(measure.dlq_depth as f64);
        metrics::gauge!("dispatcher_queue_paused", "queue" => name.clone()).set(if self.paused() {
            1.0
        } else {
            0.0
        });
        let dlq_age = measure.dlq_oldest_ms.map_or(0, |ts| (now - ts).max(0));
        metrics::gauge!("dispatcher_dlq_oldest_age_seconds", "queue" => name)
            .set(dlq_age as f64 / 1000.0);
    }
}
