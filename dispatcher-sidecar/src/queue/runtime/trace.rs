//! The queue's side of tracing (issue 8, `crate::trace`): writing the
//! message-id index where a message is produced through the API or copied to
//! a retry tier or the DLQ, and answering a lookup with what this instance's
//! lease engines know.

use super::*;

use std::future::Future;

use crate::lease::{OffsetState, RetryEnvelope};
use crate::trace::index::{self, ReadAt};
use crate::trace::{
    self as tr, CurrentState, Found, IndexEntry, Location, LocationKind, MessageTrace, Place,
    Source, Status,
};

/// How long one lookup may read the index and the record it names.
const TRACE_TIMEOUT: Duration = Duration::from_secs(30);
/// The header a redrive writes on a redriven copy (the redrive job's id).
use crate::redrive::REDRIVE_JOB_HEADER;

/// The queue's index topic and its reader.
pub(crate) struct IndexParts {
    pub topic: String,
    pub partitions: i32,
    reader: Arc<Mutex<BaseConsumer>>,
    /// One lookup at a time per queue, waited for without a thread: the
    /// blocking pool (which commits use too) holds at most one lookup per
    /// queue however many traces are asked for.
    turn: tokio::sync::Mutex<()>,
}

impl IndexParts {
    pub(crate) fn new(
        topic: String,
        partitions: i32,
        reader_config: &rdkafka::config::ClientConfig,
    ) -> anyhow::Result<IndexParts> {
        Ok(IndexParts {
            topic,
            partitions: partitions.max(1),
            reader: Arc::new(Mutex::new(reader::plain_consumer(
                reader_config,
                "trace-reader",
            )?)),
            turn: tokio::sync::Mutex::new(()),
        })
    }
}

/// Index records handed to librdkafka; [`IndexWrites::wait`] counts them.
#[must_use]
#[derive(Default)]
pub(crate) struct IndexWrites {
    sends: Vec<Result<DeliveryFuture, String>>,
}

impl IndexWrites {
    /// Waits for every delivery report; counts writes and errors. A failed
    /// index write is logged and counted, never the caller's failure: the
    /// message itself is written (a trace of it then finds an older
    /// location, or none).
    pub(crate) async fn wait(self, queue: &str) {
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut first_error = None;
        for send in self.sends {
            let result = match send {
                Ok(f) => match f.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer went away".to_string()),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => ok += 1,
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if ok > 0 {
            metrics::counter!("dispatcher_trace_index_writes_total", "queue" => queue.to_owned(), "result" => "ok")
                .increment(ok);
        }
        if failed > 0 {
            metrics::counter!("dispatcher_trace_index_writes_total", "queue" => queue.to_owned(), "result" => "error")
                .increment(failed);
            tracing::warn!(%queue, failed, "writing the message-id index: {}",
                first_error.unwrap_or_default());
        }
    }
}

impl QueueRuntime {
    /// Hands one index record (`message_id` is now at `entry.location`) to
    /// the producer.
    pub(crate) fn index_send(
        &self,
        writes: &mut IndexWrites,
        message_id: &str,
        entry: &IndexEntry,
    ) {
        let value = entry.encode();
        let record = FutureRecord::to(&self.index.topic)
            .partition(tr::index_partition(message_id, self.index.partitions))
            .key(message_id.as_bytes())
            .payload(&value[..]);
        writes.sends.push(
            self.producer
                .send_result(record)
                .map_err(|(e, _)| e.to_string()),
        );
    }

    /// Records that the message of `envelope` is now at `location`, and
    /// waits until the index has it. For the writers of a message's new
    /// copy outside the failure path: the redrive job (a redriven copy,
    /// `LocationKind::Redriven`) and an ordered queue's hold area
    /// (`LocationKind::Held`). Such a copy should also carry the message's
    /// path: add `crate::trace::path_header(<old record's headers>, <old
    /// location>)` to its headers after writing its envelope.
    pub(crate) fn record_location(
        &self,
        envelope: &RetryEnvelope,
        location: Location,
    ) -> impl Future<Output = ()> + Send + '_ {
        let mut writes = IndexWrites::default();
        let entry = IndexEntry::from_envelope(envelope, location);
        self.index_send(&mut writes, &envelope.message_id, &entry);
        writes.wait(&self.config.name)
    }

    /// The index entry of a message an API produce wrote to topic `t` (0
    /// the primary; a tier for a delayed message, which has no origin).
    pub(super) fn produced_entry(
        &self,
        t: usize,
        partition: i32,
        offset: i64,
        now: i64,
    ) -> IndexEntry {
        let location = Location {
            kind: if t == 0 {
                LocationKind::Primary
            } else {
                LocationKind::Retry
            },
            topic: self.topics[t].clone(),
            partition,
            offset,
            at_ms: now,
        };
        IndexEntry {
            origin: (t == 0).then(|| location.clone()),
            location,
        }
    }

    /// Where a record of this queue is, for the path of its next copy.
    pub(super) fn here(&self, qp: QueuePartition, offset: i64, m: &Buffered) -> Location {
        let kind = if qp.topic > 0 {
            LocationKind::Retry
        } else if m.headers.iter().any(|(k, _)| k == REDRIVE_JOB_HEADER) {
            LocationKind::Redriven
        } else {
            LocationKind::Primary
        };
        Location {
            kind,
            topic: self.topics[usize::from(qp.topic)].clone(),
            partition: qp.partition,
            offset,
            at_ms: m.timestamp_ms,
        }
    }

    /// The trace of `message_id` in this queue; `None` when the queue knows
    /// no such message.
    pub(crate) async fn trace(
        &self,
        message_id: &str,
    ) -> Result<Option<MessageTrace>, ServiceError> {
        let found = self.trace_inner(message_id).await;
        let result = match &found {
            Ok(Some(_)) => "found",
            Ok(None) => "not_found",
            Err(_) => "error",
        };
        metrics::counter!("dispatcher_trace_lookups_total", "queue" => self.name(), "result" => result)
            .increment(1);
        found
    }

    async fn trace_inner(&self, message_id: &str) -> Result<Option<MessageTrace>, ServiceError> {
        let _turn = tokio::time::timeout(TRACE_TIMEOUT, self.index.turn.lock())
            .await
            .map_err(|_| {
                unavailable("other traces of this queue are being looked up; try again")
            })?;
        let reader = Arc::clone(&self.index.reader);
        let topic = self.index.topic.clone();
        let partition = tr::index_partition(message_id, self.index.partitions);
        let id = message_id.to_owned();
        let (entry, scanned) = tokio::task::spawn_blocking(move || {
            let consumer = reader.lock().unwrap();
            index::lookup(&consumer, &topic, partition, &id, TRACE_TIMEOUT)
        })
        .await
        .expect("the index lookup does not panic")
        .map_err(|e| unavailable(format!("reading the message-id index: {e:#}")))?;
        metrics::counter!("dispatcher_trace_index_records_scanned_total", "queue" => self.name())
            .increment(scanned.records);
        let mut found = Found::default();
        let derived = entry.is_none();
        let location = match entry {
            Some(e) => {
                found.origin = e.origin;
                e.location
            }
            None => match tr::parse_derived_id(message_id) {
                Some((topic, p, o))
                    if topic == self.config.topic && (0..self.topic_partitions[0]).contains(&p) =>
                {
                    Location {
                        kind: LocationKind::Primary,
                        topic: topic.to_owned(),
                        partition: p,
                        offset: o,
                        at_ms: 0,
                    }
                }
                _ => return Ok(None),
            },
        };
        let reader = Arc::clone(&self.index.reader);
        let (topic, p, o) = (location.topic.clone(), location.partition, location.offset);
        let (record, log_start) = tokio::task::spawn_blocking(move || {
            let consumer = reader.lock().unwrap();
            index::read_at(&consumer, &topic, p, o, TRACE_TIMEOUT)
        })
        .await
        .expect("the record read does not panic")
        .map_err(|e| unavailable(format!("reading the message's record: {e:#}")))?;
        let mut location = location;
        match &record {
            ReadAt::Record {
                headers,
                timestamp_ms,
            } => {
                found.envelope = RetryEnvelope::from_headers(headers).ok().flatten();
                found.path = tr::path_of(headers);
                if derived {
                    location.at_ms = *timestamp_ms;
                    // A derived id names the record it was derived from;
                    // one that carries an id of its own is another message.
                    let own = Buffered::new(
                        &location.topic,
                        p,
                        o,
                        None,
                        bytes::Bytes::new(),
                        headers.clone(),
                        *timestamp_ms,
                        false,
                    );
                    if own.message_id != message_id {
                        return Ok(None);
                    }
                    found.origin = Some(location.clone());
                }
            }
            // A derived id of an offset that holds no record: no message.
            ReadAt::Absent { .. } | ReadAt::Gone { .. } if derived => return Ok(None),
            ReadAt::Absent { .. } | ReadAt::Gone { .. } => {}
        }
        if found.origin.is_none() {
            found.origin = found
                .envelope
                .as_ref()
                .and_then(|env| IndexEntry::from_envelope(env, location.clone()).origin);
        }
        let events = tr::events(&found, &location);
        let state = self
            .state_at(&location, &record, log_start, found.envelope.as_ref())
            .await;
        Ok(Some(MessageTrace {
            queue: self.config.name.clone(),
            message_id: message_id.to_owned(),
            events,
            state,
        }))
    }

    /// The state of the message whose latest record is at `location`.
    async fn state_at(
        &self,
        location: &Location,
        record: &ReadAt,
        log_start: i64,
        envelope: Option<&RetryEnvelope>,
    ) -> CurrentState {
        let gone = matches!(record, ReadAt::Gone { .. });
        let mut state = CurrentState {
            status: Status::NotAcked,
            location: Place::from(location),
            detail: String::new(),
            source: Source::Log,
            consumer: None,
            attempt: envelope.map(|e| e.attempt.0),
            lease_expires_at: None,
            due_at: None,
            committed_offset: None,
            log_start_offset: Some(log_start),
        };
        let left = |mut s: CurrentState| {
            s.status = Status::LeftRetention;
            s.detail = format!(
                "the record left {}'s retention (log start {log_start}) before it was acked",
                location.topic
            );
            s
        };
        match location.kind {
            LocationKind::Dlq if gone => return left(state),
            LocationKind::Dlq => {
                state.status = Status::DeadLettered;
                state.detail = format!(
                    "in {} partition {} at offset {}; a redrive delivers it again",
                    location.topic, location.partition, location.offset
                );
                return state;
            }
            LocationKind::Held => {
                state.status = Status::Held;
                state.detail = format!(
                    "held while its key is parked: in {} partition {} at offset {}",
                    location.topic, location.partition, location.offset
                );
                return state;
            }
            LocationKind::Primary | LocationKind::Redriven | LocationKind::Retry => {}
        }
        let Some(t) = self.topics.iter().position(|x| *x == location.topic) else {
            state.detail = format!("{} is not a topic of this queue", location.topic);
            return state;
        };
        let qp = QueuePartition {
            topic: u16::try_from(t).expect("a queue has few topics"),
            partition: location.partition,
        };
        let offset = location.offset;
        let where_ = format!("{} partition {}", location.topic, location.partition);
        if let Some(part) = self.partition(qp) {
            state.source = Source::Owner;
            let (engine_state, due_ms) = {
                let s = part.state.lock().unwrap();
                (
                    s.engine.offset_state(offset),
                    s.message(offset).and_then(|m| m.due_ms),
                )
            };
            match engine_state {
                OffsetState::BelowCommit { committed } => {
                    state.status = Status::Acked;
                    state.committed_offset = Some(committed);
                    state.detail = format!(
                        "acked: offset {offset} is below the commit point {committed} of {where_}"
                    );
                }
                OffsetState::AckedAboveCommit { committed } => {
                    state.status = Status::Acked;
                    state.committed_offset = Some(committed);
                    state.detail = format!(
                        "acked (above the commit point {committed} of {where_}, which waits for an earlier offset)"
                    );
                }
                OffsetState::InFlight {
                    consumer,
                    attempt,
                    expiry_ms,
                } => {
                    let name = self.names.lock().unwrap().name(consumer).map(str::to_owned);
                    state.status = Status::InFlight;
                    state.attempt = Some(attempt.0);
                    state.lease_expires_at = Some(expiry_ms);
                    state.detail = format!(
                        "in flight (attempt {}) with {}, leased until {}",
                        attempt.0,
                        name.as_deref().unwrap_or("an anonymous consumer"),
                        crate::api::json::rfc3339_ms(expiry_ms)
                    );
                    state.consumer = name;
                }
                OffsetState::PendingRoute { attempt, route } => {
                    state.status = Status::PendingRoute;
                    state.attempt = Some(attempt.0);
                    let to = match route {
                        Route::Dlq => "the DLQ".to_owned(),
                        Route::RetryTier { tier, .. } => format!(
                            "the {} retry tier",
                            format_duration(self.config.retry_tiers[tier])
                        ),
                    };
                    state.detail = format!(
                        "attempt {} failed; its copy to {to} is being written",
                        attempt.0
                    );
                }
                OffsetState::NotDone { committed } => {
                    state.committed_offset = Some(committed);
                    if gone {
                        return left(state);
                    }
                    let due = due_ms
                        .or_else(|| (t > 0).then(|| envelope.and_then(|e| e.due_ms)).flatten());
                    match due.filter(|&d| d > now_ms()) {
                        Some(d) => {
                            state.status = Status::Waiting;
                            state.due_at = Some(d);
                            state.detail = format!(
                                "waiting in {where_} until it is due at {}",
                                crate::api::json::rfc3339_ms(d)
                            );
                        }
                        None => {
                            state.status = Status::Queued;
                            state.detail = format!("waiting to be delivered from {where_}");
                        }
                    }
                }
            }
            return state;
        }
        // Not owned here: the group's commit tells whether it is done.
        let committed = match self.consumer(qp.topic) {
            Some(c) => c
                .committed(&[qp.partition], KAFKA_TIMEOUT)
                .await
                .ok()
                .and_then(|v| v.first().and_then(|&(_, o)| o)),
            None => None,
        };
        state.committed_offset = committed;
        match committed {
            Some(c) if offset < c => {
                state.source = Source::Commit;
                state.status = Status::Acked;
                state.detail = format!(
                    "acked: offset {offset} is below the group's committed offset {c} of {where_}"
                );
            }
            _ if gone => return left(state),
            _ => {
                state.source = Source::Commit;
                state.status = Status::NotAcked;
                state.detail = format!(
                    "not acked yet; {where_} is owned by another instance, which was not asked"
                );
            }
        }
        state
    }
}

impl crate::queue::Dispatcher {
    /// Records in queue `queue`'s message-id index that the message of
    /// `envelope` is now at `location`, and waits until the index has it (a
    /// failed write is counted and logged, not returned: the copy itself is
    /// written). The one entry point for writers of a message's new copy
    /// other than produce and the failure path: the redrive job (a
    /// `LocationKind::Redriven` copy) and an ordered queue's hold area
    /// (`LocationKind::Held`). Unknown queue: `UnknownQueue`.
    pub async fn record_location(
        &self,
        queue: &str,
        envelope: &RetryEnvelope,
        location: Location,
    ) -> Result<(), ServiceError> {
        self.queue(queue)?.record_location(envelope, location).await;
        Ok(())
    }
}
