//! Push subscriptions (issue 8): a queue with a `[queue.push]` table has
//! its messages delivered to an HTTP or gRPC endpoint instead of (or
//! besides) being pulled.
//!
//! Built on [`QueueService`] alone, like the APIs: per pushed queue one
//! loop receives (long poll) as many messages as there are free slots under
//! `concurrency`, with a lease of the push timeout plus a margin, and one
//! task per message calls the endpoint and acks, or nacks with the
//! endpoint's `Retry-After` (a retry tier) or `permanent` (the DLQ) and the
//! answer's text for the history. So pause, the lease, the retry tiers and
//! the DLQ are the queue's own, and a pushed queue still serves pull
//! receives (they share its messages).
//!
//! Each endpoint has a circuit breaker (`breaker.rs`): while it is open the
//! loop receives nothing, so messages wait in Kafka rather than burn
//! attempts; a message received before it opened is nacked with the
//! remaining cool-down as its retry delay instead of being sent. After the
//! cool-down one probe message goes; its success closes the breaker.
//!
//! Invariant: this module decides nothing about leases or retries; what an
//! answer means is `outcome.rs` (pure), when to send is `breaker.rs`
//! (pure, takes `now_ms`), and everything else is the queue service's.

mod breaker;
mod client;
mod outcome;
pub mod sign;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

pub use breaker::{Admit, Breaker, BreakerConfig, BreakerState};
pub use client::proto;
pub use outcome::{grpc_outcome, http_outcome, parse_retry_after, Outcome, MAX_KEPT_BODY_BYTES};

use crate::config::QueueConfig;
use crate::service::{
    Delivery, NackRequest, QueueService, ReceiveRequest, MAX_CONSUMER_ID_BYTES,
    MAX_RECEIVE_MESSAGES,
};
use client::Client;

/// How long one receive of the push loop waits for messages (a stop is
/// noticed at the latest after this).
const RECEIVE_WAIT: Duration = Duration::from_secs(2);
/// After a failed receive (Kafka unavailable), wait this long.
const RECEIVE_ERROR_BACKOFF: Duration = Duration::from_secs(1);
/// How long `stop` waits for pushes in flight to be acked or nacked;
/// after it they are dropped and their leases run out (a redelivery).
const STOP_GRACE: Duration = Duration::from_secs(10);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, ms)
}

/// The push loops of every queue with a `[queue.push]` table.
pub struct Pusher {
    stop: watch::Sender<bool>,
    loops: Vec<JoinHandle<()>>,
}

impl Pusher {
    /// Starts one loop per pushed queue over `service` (the instance's own
    /// queues: a receive leases from the partitions it owns).
    pub fn start<S: QueueService>(
        service: Arc<S>,
        queues: &[QueueConfig],
    ) -> anyhow::Result<Pusher> {
        let (stop, _) = watch::channel(false);
        let mut loops = Vec::new();
        for queue in queues {
            let Some(push) = &queue.push else { continue };
            let signer = sign::Signer::new(&push.auth, &queue.name)?;
            let client = Client::with_security(
                &push.endpoint,
                push.concurrency,
                push.timeout,
                push.ca_file.as_deref(),
                signer,
            )?;
            let endpoint = push.endpoint.redacted();
            tracing::info!(queue = %queue.name, %endpoint, "pushing");
            let lane = Arc::new(Lane {
                queue: queue.name.clone(),
                endpoint,
                lease: push.lease(queue.max_lease),
                timeout: push.timeout,
                client,
                breaker: Mutex::new(Breaker::new(BreakerConfig {
                    failures: push.breaker_failures,
                    cooldown_ms: ms(push.breaker_cooldown),
                    cooldown_max_ms: ms(push.breaker_cooldown_max),
                })),
                slots: Arc::new(Semaphore::new(push.concurrency as usize)),
                concurrency: push.concurrency,
            });
            lane.gauge_breaker(BreakerState::Closed);
            lane.in_flight_gauge().set(0.0);
            loops.push(tokio::spawn(run(
                Arc::clone(&service),
                lane,
                stop.subscribe(),
            )));
        }
        Ok(Pusher { stop, loops })
    }

    /// Stops receiving, and waits (at most [`STOP_GRACE`]) for the pushes
    /// in flight to be acked or nacked.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for l in self.loops {
            let _ = l.await;
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One pushed queue: its endpoint, breaker and concurrency slots.
struct Lane {
    queue: String,
    endpoint: String,
    lease: Duration,
    timeout: Duration,
    client: Client,
    breaker: Mutex<Breaker>,
    slots: Arc<Semaphore>,
    concurrency: u32,
}

impl Lane {
    fn labels(&self) -> [(&'static str, String); 2] {
        [
            ("queue", self.queue.clone()),
            ("endpoint", self.endpoint.clone()),
        ]
    }

    fn gauge_breaker(&self, state: BreakerState) {
        metrics::gauge!("dispatcher_push_breaker_state", &self.labels()).set(state.gauge());
    }

    fn in_flight_gauge(&self) -> metrics::Gauge {
        metrics::gauge!("dispatcher_push_in_flight", &self.labels())
    }

    /// Logs and counts a breaker transition.
    fn transition(&self, to: Option<BreakerState>) {
        let Some(to) = to else { return };
        match to {
            BreakerState::Open => {
                tracing::warn!(queue = %self.queue, endpoint = %self.endpoint, "push endpoint failing: circuit breaker open")
            }
            BreakerState::HalfOpen => {
                tracing::info!(queue = %self.queue, endpoint = %self.endpoint, "circuit breaker half-open: probing")
            }
            BreakerState::Closed => {
                tracing::info!(queue = %self.queue, endpoint = %self.endpoint, "push endpoint recovered: circuit breaker closed")
            }
        }
        self.gauge_breaker(to);
        let mut labels = self.labels().to_vec();
        labels.push(("to", to.label().to_owned()));
        metrics::counter!("dispatcher_push_breaker_transitions_total", &labels).increment(1);
    }

    fn consumer(&self) -> String {
        let mut name = format!("push:{}", self.endpoint);
        while name.len() > MAX_CONSUMER_ID_BYTES {
            name.pop();
        }
        name
    }
}

/// The loop of one pushed queue: wait for the breaker and a free slot,
/// receive up to the free slots, hand each message to its own task.
async fn run<S: QueueService>(service: Arc<S>, lane: Arc<Lane>, mut stop: watch::Receiver<bool>) {
    let consumer = lane.consumer();
    loop {
        if *stop.borrow() {
            break;
        }
        let (admit, changed) = lane.breaker.lock().unwrap().admit(now_ms());
        lane.transition(changed);
        let max = match admit {
            Admit::Go => lane.concurrency.min(MAX_RECEIVE_MESSAGES) as usize,
            Admit::Probe => 1,
            Admit::Wait { ms } => {
                let wait = Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        let probe = admit == Admit::Probe;
        // At least one free slot, then whatever else is free now.
        let first = tokio::select! {
            p = Arc::clone(&lane.slots).acquire_owned() => p.expect("the semaphore is never closed"),
            _ = stop.changed() => {
                if probe { lane.breaker.lock().unwrap().probe_unused(); }
                continue;
            }
        };
        // The breaker may have opened while this waited for a slot (the
        // requests holding the slots failed): ask again rather than receive
        // messages only to give them back.
        if !probe && lane.breaker.lock().unwrap().open_for_ms(now_ms()).is_some() {
            continue;
        }
        let mut permits = vec![first];
        while permits.len() < max {
            match Arc::clone(&lane.slots).try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        // Not raced with the stop: a receive cut short could have leased
        // messages nobody sends (they would come back only after their
        // lease). It returns within RECEIVE_WAIT anyway.
        let received = service
            .receive(
                &lane.queue,
                ReceiveRequest {
                    max_messages: permits.len() as u32,
                    wait: RECEIVE_WAIT,
                    lease: Some(lane.lease),
                    consumer: Some(consumer.clone()),
                },
            )
            .await;
        let deliveries = match received {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(queue = %lane.queue, "push: receive failed: {e}");
                if probe {
                    lane.breaker.lock().unwrap().probe_unused();
                }
                tokio::select! {
                    _ = tokio::time::sleep(RECEIVE_ERROR_BACKOFF) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
        };
        if probe && deliveries.is_empty() {
            lane.breaker.lock().unwrap().probe_unused();
        }
        for d in deliveries {
            let permit = permits.pop().expect("no more deliveries than slots");
            tokio::spawn(push_one(
                Arc::clone(&service),
                Arc::clone(&lane),
                d,
                probe,
                permit,
            ));
        }
    }
    // Wait for the pushes in flight: each holds a slot until it has acked
    // or nacked.
    let all = lane.concurrency;
    if tokio::time::timeout(STOP_GRACE, lane.slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(queue = %lane.queue, "push: stopping with pushes still in flight; their leases will run out");
    }
}

/// Sends one message and settles it: ack, or nack for a retry or the DLQ.
async fn push_one<S: QueueService>(
    service: Arc<S>,
    lane: Arc<Lane>,
    d: Delivery,
    probe: bool,
    _slot: OwnedSemaphorePermit,
) {
    let open_for = lane.breaker.lock().unwrap().open_for_ms(now_ms());
    if let Some(open_ms) = open_for.filter(|_| !probe) {
        // Received before the breaker opened: give it back, due after the
        // cool-down, without calling the endpoint.
        metrics::counter!("dispatcher_push_breaker_rejections_total", &lane.labels()).increment(1);
        let retry_after = Duration::from_millis(u64::try_from(open_ms).unwrap_or(0));
        settle_nack(
            &*service,
            &lane,
            &d,
            Some(retry_after),
            "push: circuit breaker open, not sent".into(),
            false,
        )
        .await;
        return;
    }
    let in_flight = lane.in_flight_gauge();
    in_flight.increment(1.0);
    let started = Instant::now();
    let outcome = lane.client.deliver(&lane.queue, &d, lane.timeout).await;
    let elapsed = started.elapsed();
    in_flight.decrement(1.0);
    metrics::histogram!("dispatcher_push_latency_seconds", &lane.labels())
        .record(elapsed.as_secs_f64());
    let mut labels = lane.labels().to_vec();
    labels.push(("outcome", outcome.label().to_owned()));
    metrics::counter!("dispatcher_push_requests_total", &labels).increment(1);
    let changed = lane
        .breaker
        .lock()
        .unwrap()
        .record(probe, outcome.endpoint_failed(), now_ms());
    lane.transition(changed);
    match outcome {
        Outcome::Ack => match service
            .ack(&lane.queue, std::slice::from_ref(&d.receipt))
            .await
        {
            Ok(results) if results.first() == Some(&crate::service::ReceiptOutcome::Ok) => {}
            Ok(results) => settle_failed(&lane, &d, &format!("ack answered {results:?}")),
            Err(e) => settle_failed(&lane, &d, &e.to_string()),
        },
        Outcome::DeadLetter { error } => {
            settle_nack(&*service, &lane, &d, None, error, true).await;
        }
        Outcome::Retry {
            retry_after, error, ..
        } => {
            settle_nack(&*service, &lane, &d, retry_after, error, false).await;
        }
    }
}

async fn settle_nack<S: QueueService>(
    service: &S,
    lane: &Lane,
    d: &Delivery,
    retry_after: Option<Duration>,
    error: String,
    permanent: bool,
) {
    let request = NackRequest {
        receipt: d.receipt.clone(),
        retry_after,
        error: Some(error),
        permanent,
    };
    match service.nack(&lane.queue, request).await {
        Ok(crate::service::ReceiptOutcome::Ok) => {}
        Ok(other) => settle_failed(lane, d, &format!("nack answered {other:?}")),
        Err(e) => settle_failed(lane, d, &e.to_string()),
    }
}

/// An ack or nack that did not take (Kafka unavailable, or the lease is
/// over: the partition moved, or the lease ran out). The message comes
/// back when its lease runs out, if it has not already.
fn settle_failed(lane: &Lane, d: &Delivery, why: &str) {
    tracing::warn!(
        queue = %lane.queue,
        message_id = %d.message_id,
        "push: settling a pushed message failed ({why}); it will be delivered again"
    );
    metrics::counter!("dispatcher_push_settle_errors_total", &lane.labels()).increment(1);
}
