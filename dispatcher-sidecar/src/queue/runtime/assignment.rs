//! Assignment changes: rebuilding partitions from the ack log and the
//! group commit, resuming parked ones, revokes, commits and fetch tasks.

use super::*;
use crate::queue::ordered::{OrderedKeys, OrderedRecord};

impl QueueRuntime {
    /// Restores the newly assigned partitions of topic `t` from the ack log
    /// and the group's commits, then starts fetching them.
    pub(crate) async fn assign(self: &Arc<Self>, t: u16, partitions: Vec<i32>) {
        let _serial = self.assigning.lock().await;
        for attempt in 1..=2 {
            match self.try_assign(t, &partitions).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, topic = %self.topics[usize::from(t)],
                        ?partitions, attempt, "rebuilding assigned partitions failed: {e:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        tracing::error!(queue = %self.config.name, ?partitions,
            "assigned partitions not served yet: the periodic repair tries again");
    }

    /// Rebuilds partitions the group assigned that are still not served
    /// (their rebuild failed) on two passes in a row (one pass may just
    /// precede the assignment event).
    pub(super) async fn repair(self: &Arc<Self>) {
        let Ok(_serial) = self.assigning.try_lock() else {
            return;
        };
        let served: Vec<QueuePartition> = self.owned().iter().map(|p| p.qp).collect();
        let mut missing = BTreeSet::new();
        for t in 0..self.topics.len() {
            let t = u16::try_from(t).expect("validated at start");
            let Some(consumer) = self.consumer(t) else {
                continue;
            };
            for partition in consumer.assigned() {
                let qp = QueuePartition {
                    topic: t,
                    partition,
                };
                if !served.contains(&qp) {
                    missing.insert(qp);
                }
            }
        }
        let previous = std::mem::replace(&mut *self.unserved.lock().unwrap(), missing.clone());
        let mut again: BTreeMap<u16, Vec<i32>> = BTreeMap::new();
        for qp in missing.intersection(&previous) {
            again.entry(qp.topic).or_default().push(qp.partition);
        }
        for (t, partitions) in again {
            tracing::info!(queue = %self.config.name, topic = t, ?partitions, "repairing unserved partitions");
            if let Err(e) = self.try_assign(t, &partitions).await {
                tracing::warn!(queue = %self.config.name, topic = t, ?partitions, "repair failed: {e:#}");
            }
        }
    }

    async fn try_assign(self: &Arc<Self>, t: u16, partitions: &[i32]) -> anyhow::Result<()> {
        let consumer = self
            .consumer(t)
            .ok_or_else(|| anyhow::anyhow!("consumer closed"))?;
        let committed: HashMap<i32, Option<i64>> = consumer
            .committed(partitions, KAFKA_TIMEOUT)
            .await?
            .into_iter()
            .collect();
        let resumed = self.unpark(t, partitions, &committed).await;
        let resumed_partitions: Vec<i32> = resumed.iter().map(|p| p.qp.partition).collect();
        for part in resumed {
            tracing::info!(queue = %self.config.name, partition = %part.qp,
                "partition resumed as it was at its revoke");
            part.closed.store(false, Ordering::SeqCst);
            self.serve(part, &consumer).await;
        }
        let partitions: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| !resumed_partitions.contains(p))
            .collect();
        let partitions = &partitions[..];
        if partitions.is_empty() {
            self.ready.notify_waiters();
            return Ok(());
        }
        let readers = Arc::clone(&self.readers);
        let ack_topic = self.config.ack_log_topic.clone();
        let topic = self.topics[usize::from(t)].clone();
        let ack_parts: Vec<i32> = partitions
            .iter()
            .map(|p| p % self.ack_log_partitions)
            .collect();
        let need_low: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| committed.get(p).copied().flatten().is_none())
            .collect();
        let started = Instant::now();
        let ((events, ordered_records), lows) =
            tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                let events = reader::read_ack_log(
                    &readers.ack_log.lock().unwrap(),
                    &ack_topic,
                    &ack_parts,
                    KAFKA_TIMEOUT * 2,
                )?;
                let meta = readers.meta.lock().unwrap();
                let mut lows = HashMap::new();
                for p in need_low {
                    lows.insert(p, meta.fetch_watermarks(&topic, p, KAFKA_TIMEOUT)?.0);
                }
                Ok((events, lows))
            })
            .await??;
        let mut by_partition: HashMap<i32, Vec<LeaseEvent>> = HashMap::new();
        for (qp, event) in events {
            if qp.topic == t && partitions.contains(&qp.partition) {
                by_partition.entry(qp.partition).or_default().push(event);
            }
        }
        let mut ordered_by_partition: HashMap<i32, Vec<OrderedRecord>> = HashMap::new();
        for (qp, record) in ordered_records {
            if qp.topic == t && partitions.contains(&qp.partition) {
                ordered_by_partition
                    .entry(qp.partition)
                    .or_default()
                    .push(record);
            }
        }
        let mut floors = Pending::default();
        let mut rebuilt_parts = Vec::with_capacity(partitions.len());
        for &p in partitions {
            let qp = QueuePartition {
                topic: t,
                partition: p,
            };
            let base = committed
                .get(&p)
                .copied()
                .flatten()
                .or_else(|| lows.get(&p).copied())
                .unwrap_or(0);
            let events = by_partition.remove(&p).unwrap_or_default();
            let event_count = events.len();
            let mut acked = acked_above_commit(&events, base);
            let rebuilt = PartitionLeases::rebuild(qp, self.lease_config.clone(), base, events)?;
            let acked = acked.split_off(&rebuilt.leases.committed_offset());
            tracing::info!(queue = %self.config.name, partition = %qp, group_committed = base,
                committed = rebuilt.leases.committed_offset(), released = rebuilt.expired.len(),
                pending_routes = rebuilt.pending_routes.len(), event_count,
                elapsed_ms = started.elapsed().as_millis() as u64, "partition rebuilt");
            let mut state = PartitionState::rebuilt(rebuilt, acked);
            if self.config.ordered && t == 0 {
                let records = ordered_by_partition.remove(&p).unwrap_or_default();
                let committed = state.engine.committed_offset();
                state.set_ordered(OrderedKeys::new(records, committed));
            }
            // The ownership's generation, written before the first lease.
            floors.merge(self.write_events(&mut state));
            rebuilt_parts.push(Arc::new(Partition::new(qp, state, base, self.fair.clone())));
        }
        floors.wait().await.map_err(|e| {
            anyhow::anyhow!("writing the partitions' generations to the ack log: {e}")
        })?;
        for partition in rebuilt_parts {
            self.serve(partition, &consumer).await;
        }
        self.ready.notify_waiters();
        Ok(())
    }

    /// Makes `partition` owned and starts its fetch task.
    async fn serve(self: &Arc<Self>, partition: Arc<Partition>, consumer: &Arc<QueueConsumer>) {
        let old = self
            .partitions
            .write()
            .unwrap()
            .insert(partition.qp, Arc::clone(&partition));
        if let Some(old) = old {
            old.close().await;
        }
        let this = Arc::clone(self);
        let consumer = Arc::clone(consumer);
        let part = Arc::clone(&partition);
        let task = tokio::spawn(async move { this.fetch_loop(part, consumer).await });
        *partition.fetch_task.lock().unwrap() = Some(task);
    }

    /// Commits the final offsets of revoked partitions and forgets them.
    pub(crate) async fn revoke(&self, t: u16, partitions: &[i32]) {
        let _serial = self.assigning.lock().await;
        let mut gone = Vec::new();
        {
            let mut map = self.partitions.write().unwrap();
            for &p in partitions {
                if let Some(part) = map.remove(&QueuePartition {
                    topic: t,
                    partition: p,
                }) {
                    gone.push(part);
                }
            }
        }
        // Before the release: a fetch task still running when the group
        // hands the partition back would take records of the new assignment.
        for part in &gone {
            part.close().await;
        }
        // Writes of requests still running land before the next owner reads
        // the ack log.
        self.ack_log.drain(Duration::from_secs(5)).await;
        let producer = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || {
            rdkafka::producer::Producer::flush(&producer, Duration::from_secs(5))
        })
        .await;
        self.commit(&gone, true).await;
        for part in &gone {
            metrics::gauge!("dispatcher_in_flight", "queue" => self.name(), "partition" => self.label(part.qp)).set(0.0);
        }
        self.park(gone).await;
    }

    /// Keeps revoked partitions whose final commit is stored, with the
    /// ack-log end that proves later that nobody wrote since.
    async fn park(&self, gone: Vec<Arc<Partition>>) {
        let committed: Vec<(Arc<Partition>, i64)> = gone
            .into_iter()
            .filter_map(|part| {
                let committed = part.lock().engine.committed_offset();
                (part.last_commit.load(Ordering::SeqCst) == committed).then_some((part, committed))
            })
            .collect();
        if committed.is_empty() {
            return;
        }
        let ends = self
            .ack_log_ends(committed.iter().map(|(p, _)| p.qp.partition).collect())
            .await;
        let Ok(ends) = ends else { return };
        let mut parked = self.parked.lock().unwrap();
        for (part, committed) in committed {
            let end = ends[&(part.qp.partition % self.ack_log_partitions)];
            parked.insert(
                part.qp,
                Parked {
                    part,
                    ack_log_end: end,
                    committed,
                    at: Instant::now(),
                },
            );
        }
    }

    /// The end offsets of the ack-log partitions of `partitions`.
    async fn ack_log_ends(&self, partitions: Vec<i32>) -> anyhow::Result<HashMap<i32, i64>> {
        let readers = Arc::clone(&self.readers);
        let topic = self.config.ack_log_topic.clone();
        let n = self.ack_log_partitions;
        tokio::task::spawn_blocking(move || {
            let meta = readers.meta.lock().unwrap();
            let mut ends = HashMap::new();
            for p in partitions {
                let a = p % n;
                if let std::collections::hash_map::Entry::Vacant(e) = ends.entry(a) {
                    e.insert(meta.fetch_watermarks(&topic, a, STATS_TIMEOUT)?.1);
                }
            }
            Ok(ends)
        })
        .await?
    }

    /// Parked states of `partitions` that nobody changed since their revoke
    /// (same group commit, no ack-log write): they resume as they were.
    async fn unpark(
        &self,
        t: u16,
        partitions: &[i32],
        committed: &HashMap<i32, Option<i64>>,
    ) -> Vec<Arc<Partition>> {
        let candidates: Vec<Parked> = {
            let mut parked = self.parked.lock().unwrap();
            parked.retain(|_, p| p.at.elapsed() < PARKED_TTL);
            partitions
                .iter()
                .filter_map(|&partition| {
                    parked.remove(&QueuePartition {
                        topic: t,
                        partition,
                    })
                })
                .filter(|p| {
                    committed.get(&p.part.qp.partition).copied().flatten() == Some(p.committed)
                })
                .collect()
        };
        if candidates.is_empty() {
            return Vec::new();
        }
        let Ok(ends) = self
            .ack_log_ends(candidates.iter().map(|p| p.part.qp.partition).collect())
            .await
        else {
            return Vec::new();
        };
        candidates
            .into_iter()
            .filter(|p| {
                ends.get(&(p.part.qp.partition % self.ack_log_partitions)) == Some(&p.ack_log_end)
            })
            .map(|p| p.part)
            .collect()
    }

    /// Commits each partition's commit point to the group when it moved
    /// (`force`: always).
    pub(super) async fn commit(&self, parts: &[Arc<Partition>], force: bool) {
        let mut by_topic: BTreeMap<u16, Vec<(Arc<Partition>, i64)>> = BTreeMap::new();
        for part in parts {
            let committed = part.lock().engine.committed_offset();
            if force || committed != part.last_commit.load(Ordering::SeqCst) {
                by_topic
                    .entry(part.qp.topic)
                    .or_default()
                    .push((Arc::clone(part), committed));
            }
        }
        for (t, list) in by_topic {
            let Some(consumer) = self.consumer(t) else {
                continue;
            };
            let offsets: Vec<(i32, i64)> = list.iter().map(|(p, o)| (p.qp.partition, *o)).collect();
            match consumer.commit(&offsets).await {
                Ok(()) => {
                    for (p, o) in list {
                        p.last_commit.store(o, Ordering::SeqCst);
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %self.config.name, topic = %self.topics[usize::from(t)],
                    ?offsets, "commit failed: {e}")
                }
            }
        }
    }

    /// Closes every owned partition after committing its commit point.
    pub(crate) async fn stop(&self) {
        self.stop_dedupe();
        self.stop_control();
        let parts: Vec<Arc<Partition>> = self
            .partitions
            .write()
            .unwrap()
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in &parts {
            p.close().await;
        }
        self.commit(&parts, true).await;
        // The ack-log records of requests that ended meanwhile reach the
        // producer (flushed at shutdown).
        self.ack_log.drain(Duration::from_secs(5)).await;
    }

    pub(crate) fn take_consumers(&self) -> Vec<Arc<QueueConsumer>> {
        std::mem::take(&mut *self.consumers.write().unwrap())
    }

    /// Moves fetched records into the partition's buffer, up to the
    /// prefetch bound, until the partition is closed or revoked.
    async fn fetch_loop(self: Arc<Self>, part: Arc<Partition>, consumer: Arc<QueueConsumer>) {
        let is_tier = part.qp.topic > 0;
        while !part.closed.load(Ordering::SeqCst) {
            let room = {
                let space = part.space.notified();
                tokio::pin!(space);
                space.as_mut().enable();
                let (room, spilled) = {
                    let mut state = part.lock();
                    let spilled = state.prefetch_room() == 0 && state.spill(now_ms());
                    (state.prefetch_room(), spilled)
                };
                if spilled {
                    // Ordered queues: a busy key's records leave the
                    // prefetch for the hold.
                    self.hold(&part).await;
                }
                if room == 0 {
                    let _ = tokio::time::timeout(Duration::from_millis(500), space).await;
                    continue;
                }
                room
            };
            let batch = match consumer
                .fetch(
                    part.qp.partition,
                    room.min(FETCH_BATCH),
                    Duration::from_millis(500),
                    &ToBuffered { is_tier },
                )
                .await
            {
                Ok(batch) => batch,
                Err(FetchError::NotAssigned(_)) => return,
                Err(FetchError::Kafka(e)) => {
                    self.fetch_failed(&part, &e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            if batch.is_empty() {
                continue;
            }
            self.fetch_recovered(&part);
            tracing::debug!(queue = %self.config.name, partition = %part.qp, n = batch.len(),
                first = batch[0].0, "fetched");
            let (pending, routable) = {
                let mut state = part.lock();
                if part.closed.load(Ordering::SeqCst) {
                    return;
                }
                for (offset, m) in batch {
                    state.offer(offset, m);
                }
                (self.write_events(&mut state), state.has_routable())
            };
            self.ready.notify_waiters();
            if let Err(e) = pending.wait().await {
                tracing::warn!(queue = %self.config.name, partition = %part.qp, "ack-log write: {e}");
            }
            if routable {
                self.route(&part).await;
            }
            if part.lock().has_holdable() {
                self.hold(&part).await;
            }
        }
    }
}

impl QueueRuntime {
    /// librdkafka reported an error on the partition (e.g. a batch it
    /// cannot decode, which it reports again at every fetch and never gets
    /// past): counted, shown by the stats and the stuck gauge, and logged
    /// once per run of errors.
    fn fetch_failed(&self, part: &Partition, e: &rdkafka::error::KafkaError) {
        let offset = part.lock().fetched_to();
        let started = part
            .fetch_health
            .lock()
            .unwrap()
            .failed(e.to_string(), offset, now_ms());
        let label = self.label(part.qp);
        metrics::counter!("dispatcher_fetch_errors_total", "queue" => self.name(), "partition" => label.clone())
            .increment(1);
        metrics::gauge!("dispatcher_partition_stuck", "queue" => self.name(), "partition" => label)
            .set(1.0);
        let topic = &self.topics[usize::from(part.qp.topic)];
        if started {
            tracing::error!(queue = %self.config.name, %topic, partition = part.qp.partition,
                offset, "cannot read the partition's records: {e}; nothing at or after this \
                offset is delivered until they can be read");
        } else {
            tracing::debug!(queue = %self.config.name, %topic, partition = part.qp.partition,
                offset, "fetch: {e}");
        }
    }

    /// Records came: a run of fetch errors, if any, is over.
    fn fetch_recovered(&self, part: &Partition) {
        let Some(run) = part.fetch_health.lock().unwrap().fetched() else {
            return;
        };
        metrics::gauge!("dispatcher_partition_stuck", "queue" => self.name(), "partition" => self.label(part.qp))
            .set(0.0);
        tracing::info!(queue = %self.config.name, topic = %self.topics[usize::from(part.qp.topic)],
            partition = part.qp.partition, offset = run.offset, errors = run.errors,
            "the partition's records are read again");
    }
}

/// A fetched record as the partition keeps it: its offset and a
/// [`Buffered`] read straight from librdkafka's buffer.
struct ToBuffered {
    is_tier: bool,
}

impl crate::kafka::consumer::Decode for ToBuffered {
    type Out = (i64, Buffered);

    fn decode<M: rdkafka::Message>(&self, m: &M) -> (i64, Buffered) {
        (m.offset(), Buffered::from_record(m, self.is_tier))
    }
}
