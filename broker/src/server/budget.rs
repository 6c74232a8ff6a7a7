//! The broker-wide memory budget for requests (`queued.max.request.bytes`).
//!
//! A connection charges a request's bytes as they arrive off the socket, and
//! its decoded size once the guard has walked it; the charge is given back
//! when the request has been answered. The budget is not a queue: whoever
//! finds room takes it, so a small request never waits behind a large one
//! that is still arriving, and a frame header that declares 100 MB and then
//! stalls holds only the bytes it sent. A reader that finds no room waits
//! until some is given back or its deadline passes; the deadline (the
//! request read timeout) is what breaks a standoff between partial requests
//! that each wait for room the others hold.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The budget ran out and nothing was given back before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetTimedOut;

pub struct MemoryBudget {
    limit_bytes: usize,
    used_bytes: AtomicUsize,
    /// Readers waiting for room; a give-back wakes them only when some wait.
    waiters: AtomicUsize,
    freed: Notify,
    used_gauge: metrics::Gauge,
    waits: metrics::Counter,
}

impl MemoryBudget {
    pub fn new(limit_bytes: usize) -> Self {
        metrics::gauge!("kafka_broker_request_memory_limit_bytes").set(limit_bytes as f64);
        Self {
            limit_bytes,
            used_bytes: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            freed: Notify::new(),
            used_gauge: metrics::gauge!("kafka_broker_request_memory_bytes"),
            waits: metrics::counter!("kafka_broker_request_memory_waits_total"),
        }
    }

    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
    }

    #[cfg(test)]
    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::SeqCst)
    }

    fn try_take(&self, n: usize) -> bool {
        let mut used = self.used_bytes.load(Ordering::SeqCst);
        loop {
            if used + n > self.limit_bytes {
                return false;
            }
            match self.used_bytes.compare_exchange_weak(
                used,
                used + n,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    self.used_gauge.set((used + n) as f64);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Takes `n` bytes, waiting for room until `deadline`.
    async fn take(&self, n: usize, deadline: Instant) -> Result<(), BudgetTimedOut> {
        if self.try_take(n) {
            return Ok(());
        }
        self.waits.increment(1);
        // Registered before the retry below, and the give-back side reads it
        // after returning its bytes (both sequentially consistent), so a
        // give-back either lets the retry succeed or sees this waiter.
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let result = loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(n) {
                break Ok(());
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                // One last look: room may have come back at the deadline.
                break if self.try_take(n) {
                    Ok(())
                } else {
                    Err(BudgetTimedOut)
                };
            }
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self.used_bytes.fetch_sub(n, Ordering::SeqCst);
        self.used_gauge.set((before - n) as f64);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// Bytes held from a budget, given back when dropped.
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Charge {
    pub fn new(budget: Arc<MemoryBudget>) -> Self {
        Self { budget, bytes: 0 }
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds `n` bytes to the charge, waiting for room until `deadline`.
    pub async fn take(&mut self, n: usize, deadline: Instant) -> Result<(), BudgetTimedOut> {
        self.budget.take(n, deadline).await?;
        self.bytes += n;
        Ok(())
    }

    /// Gives `n` of the charged bytes back.
    pub fn give_back(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.bytes -= n;
        self.budget.give_back(n);
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn later(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn charges_are_given_back_when_dropped() {
        let budget = Arc::new(MemoryBudget::new(100));
        let mut a = Charge::new(budget.clone());
        a.take(60, later(10)).await.unwrap();
        a.give_back(10);
        assert_eq!(budget.used_bytes(), 50);
        let mut b = Charge::new(budget.clone());
        b.take(50, later(10)).await.unwrap();
        assert_eq!(budget.used_bytes(), 100);
        drop(a);
        drop(b);
        assert_eq!(budget.used_bytes(), 0);
    }

    #[tokio::test]
    async fn a_small_take_is_not_queued_behind_a_large_waiting_one() {
        let budget = Arc::new(MemoryBudget::new(100));
        let mut held = Charge::new(budget.clone());
        held.take(90, later(10)).await.unwrap();
        // A large take waits for room...
        let large = {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut c = Charge::new(budget);
                c.take(50, later(10_000)).await.map(|()| c)
            })
        };
        tokio::task::yield_now().await;
        // ...while a small one that fits goes ahead at once.
        let mut small = Charge::new(budget.clone());
        small.take(10, later(0)).await.unwrap();
        drop(small);
        // Room given back wakes the large one.
        drop(held);
        let large = large.await.unwrap().expect("woken when room came back");
        assert_eq!(large.bytes(), 50);
    }

    #[tokio::test]
    async fn a_take_that_finds_no_room_times_out_at_its_deadline() {
        let budget = Arc::new(MemoryBudget::new(100));
        let mut held = Charge::new(budget.clone());
        held.take(100, later(10)).await.unwrap();
        let mut c = Charge::new(budget.clone());
        let started = Instant::now();
        assert_eq!(c.take(1, later(200)).await, Err(BudgetTimedOut));
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(c.bytes(), 0);
        assert_eq!(budget.used_bytes(), 100);
    }
}
