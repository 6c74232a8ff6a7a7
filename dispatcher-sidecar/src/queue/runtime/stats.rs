//! Stats: watermarks of the owned partitions and the DLQ figures.

use super::*;
use crate::service::StuckPartition;

impl QueueRuntime {
    /// The owned partitions' watermarks (asked each time: a depth must not
    /// lag a produce), and the DLQ's depth and oldest record (cached for
    /// `STATS_TTL`: it costs a fetch).
    pub(super) async fn measure(&self) -> Result<Measure, ServiceError> {
        let owned: Vec<(QueuePartition, String)> = self
            .owned()
            .iter()
            .map(|p| (p.qp, self.topics[usize::from(p.qp.topic)].clone()))
            .collect();
        let readers = Arc::clone(&self.readers);
        let watermarks = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let meta = readers.meta.lock().unwrap();
            let mut watermarks = HashMap::new();
            for (qp, topic) in owned {
                watermarks.insert(
                    qp,
                    meta.fetch_watermarks(&topic, qp.partition, STATS_TIMEOUT)?,
                );
            }
            Ok(watermarks)
        })
        .await
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("{e:#}")))?;
        let (dlq_depth, dlq_oldest_ms) = self.dlq().await?;
        Ok(Measure {
            watermarks,
            dlq_depth,
            dlq_oldest_ms,
        })
    }

    async fn dlq(&self) -> Result<DlqFigures, ServiceError> {
        let mut cache = self.dlq_cache.lock().await;
        if let Some((at, dlq)) = *cache {
            if at.elapsed() < STATS_TTL {
                return Ok(dlq);
            }
        }
        let readers = Arc::clone(&self.readers);
        let dlq_topic = self.config.dlq_topic.clone();
        let dlq_partitions = self.dlq_partitions;
        let dlq = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut depth = 0;
            let mut starts = Vec::new();
            // The DLQ's depth starts at each partition's redrive floor: the
            // records below it were all redriven (`crate::redrive::store`).
            let floors = crate::redrive::store::read_floors(
                &readers.redrive_floors.lock().unwrap(),
                &dlq_topic,
                dlq_partitions,
                STATS_TIMEOUT,
            )?;
            {
                let meta = readers.meta.lock().unwrap();
                for p in 0..dlq_partitions {
                    let (low, high) = meta.fetch_watermarks(&dlq_topic, p, STATS_TIMEOUT)?;
                    let start = floors.get(&p).map_or(low, |&f| f.max(low));
                    if high > start {
                        depth += high - start;
                        starts.push((p, start));
                    }
                }
            }
            let oldest = reader::oldest_timestamp_ms(
                &readers.dlq.lock().unwrap(),
                &dlq_topic,
                &starts,
                STATS_TIMEOUT,
            )?;
            Ok((depth, oldest))
        })
        .await
        .map_err(unavailable)?
        .map_err(|e| unavailable(format!("{e:#}")))?;
        *cache = Some((Instant::now(), dlq));
        Ok(dlq)
    }

    pub(crate) async fn stats(&self) -> Result<QueueStats, ServiceError> {
        let measure = self.measure().await?;
        let now = now_ms();
        let mut stats = QueueStats {
            dlq_depth: measure.dlq_depth,
            dlq_oldest_age_ms: measure.dlq_oldest_ms.map_or(0, |ts| (now - ts).max(0)),
            paused: self.paused(),
            ..QueueStats::default()
        };
        for part in self.owned() {
            if let Some(run) = part.fetch_health.lock().unwrap().stuck(now) {
                stats.stuck_partitions.push(StuckPartition {
                    topic: self.topics[usize::from(part.qp.topic)].clone(),
                    partition: part.qp.partition,
                    offset: run.offset,
                    error: run.error.clone(),
                    since_ms: run.since_ms,
                    errors: run.errors,
                });
            }
            let (in_flight, committed, oldest) = {
                let s = part.lock();
                (
                    s.engine.in_flight_len() as u64,
                    s.engine.committed_offset(),
                    s.oldest_timestamp_ms(),
                )
            };
            let high = measure
                .watermarks
                .get(&part.qp)
                .map_or(committed, |&(_, h)| h);
            let depth = (high - committed).max(0);
            if part.qp.topic > 0 {
                stats.retry_depth += depth;
                stats.in_flight += in_flight;
                continue;
            }
            let age = if depth > 0 {
                oldest.map_or(0, |ts| (now - ts).max(0))
            } else {
                0
            };
            stats.depth += depth;
            stats.in_flight += in_flight;
            stats.oldest_unacked_age_ms = stats.oldest_unacked_age_ms.max(age);
            stats.partitions.push(PartitionStats {
                partition: part.qp.partition,
                depth,
                in_flight,
                oldest_unacked_age_ms: age,
            });
        }
        Ok(stats)
    }
}
