//! Weighted fair sharing of the dispatcher's in-flight budget across its
//! queues (issue 8: "a queue with 500 pollers does not starve one with 5").
//!
//! Every lease holds its message in memory until it is acked, nacked or runs
//! out, so an instance bounds the leases it has out at once:
//! `max_in_flight`, across all its queues. While the budget has room, a
//! receive (pull or push) leases at once. When it is spent, receives wait,
//! and the room freed by acks, nacks and expiries is handed out by deficit
//! round-robin over the queues that have receives waiting, each queue's
//! share in proportion to its `weight`: a queue with 500 waiting pollers
//! gets its weight's share, not 500 times the share of a queue with 5.
//!
//! [`Core`] is the policy, pure and synchronous (tested below); [`FairShare`]
//! wraps it with the waiting. The runtime reports in-flight changes from the
//! partitions' locks (`Partition::lock`), so the count is the engines' own
//! and cannot drift.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// Leases a queue of weight 1 is granted per round-robin turn.
pub const QUANTUM: usize = 10;

/// A receive's place in its queue's line.
pub type Ticket = u64;

struct Waiter {
    ticket: Ticket,
    want: usize,
}

struct Lane {
    weight: usize,
    /// Leases this lane may still be granted in the current turn.
    deficit: usize,
    waiting: VecDeque<Waiter>,
}

/// The sharing policy: how much room there is, who waits, who is next.
pub struct Core {
    capacity: usize,
    /// Leases out, as the partitions report them.
    in_flight: usize,
    /// Granted to receives that have not leased yet.
    reserved: usize,
    lanes: Vec<Lane>,
    /// The lane whose turn it is.
    cursor: usize,
    /// Whether the lane at `cursor` has had its quantum for this turn.
    credited: bool,
    next_ticket: Ticket,
}

impl Core {
    /// `weights[i]` is queue i's weight (at least 1).
    pub fn new(capacity: usize, weights: &[u32]) -> Core {
        Core {
            capacity,
            in_flight: 0,
            reserved: 0,
            lanes: weights
                .iter()
                .map(|&w| Lane {
                    weight: w.max(1) as usize,
                    deficit: 0,
                    waiting: VecDeque::new(),
                })
                .collect(),
            cursor: 0,
            credited: false,
            next_ticket: 0,
        }
    }

    fn free(&self) -> usize {
        self.capacity.saturating_sub(self.in_flight + self.reserved)
    }

    fn anyone_waiting(&self) -> bool {
        self.lanes.iter().any(|l| !l.waiting.is_empty())
    }

    /// Room for up to `want` leases at once, when there is room and nobody
    /// waits (a newcomer does not overtake a waiting receive).
    pub fn admit(&mut self, want: usize) -> Option<usize> {
        let n = want.min(self.free());
        if n == 0 || self.anyone_waiting() {
            return None;
        }
        self.reserved += n;
        Some(n)
    }

    /// Puts a receive of `lane` in line.
    pub fn enqueue(&mut self, lane: usize, want: usize) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.lanes[lane].waiting.push_back(Waiter {
            ticket,
            want: want.max(1),
        });
        ticket
    }

    /// Takes a receive out of line (it stopped waiting). False when it is
    /// not in line (already granted).
    pub fn cancel(&mut self, lane: usize, ticket: Ticket) -> bool {
        let waiting = &mut self.lanes[lane].waiting;
        match waiting.iter().position(|w| w.ticket == ticket) {
            Some(i) => {
                waiting.remove(i);
                if waiting.is_empty() {
                    self.lanes[lane].deficit = 0;
                }
                true
            }
            None => false,
        }
    }

    /// A granted receive is done leasing: its reservation ends (what it
    /// leased is in flight now, reported by its partitions).
    pub fn release(&mut self, granted: usize) {
        self.reserved = self.reserved.saturating_sub(granted);
    }

    /// Leases came (positive) or went (negative).
    pub fn in_flight_changed(&mut self, delta: isize) {
        self.in_flight = self.in_flight.saturating_add_signed(delta);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn waiting(&self, lane: usize) -> usize {
        self.lanes[lane].waiting.len()
    }

    /// Hands the free room to waiting receives, deficit round-robin: each
    /// lane's turn grants up to `QUANTUM * weight` leases to its receives in
    /// arrival order, then the next lane with receives waiting has its turn.
    /// Returns (lane, ticket, leases granted); each is reserved.
    pub fn distribute(&mut self) -> Vec<(usize, Ticket, usize)> {
        let mut grants = Vec::new();
        while self.free() > 0 && self.anyone_waiting() {
            let lane = &mut self.lanes[self.cursor];
            if lane.waiting.is_empty() {
                lane.deficit = 0;
                self.next_lane();
                continue;
            }
            if !self.credited {
                lane.deficit += QUANTUM * lane.weight;
                self.credited = true;
            }
            let free = self.capacity - self.in_flight - self.reserved;
            let lane = &mut self.lanes[self.cursor];
            let n = lane.waiting[0].want.min(free).min(lane.deficit);
            let waiter = lane.waiting.pop_front().expect("not empty");
            lane.deficit -= n;
            self.reserved += n;
            grants.push((self.cursor, waiter.ticket, n));
            if lane.waiting.is_empty() {
                lane.deficit = 0;
            }
            if lane.deficit == 0 {
                self.next_lane();
            }
        }
        grants
    }

    fn next_lane(&mut self) {
        self.cursor = (self.cursor + 1) % self.lanes.len();
        self.credited = false;
    }
}

/// The budget shared by the queues of one instance; `lane` is the queue's
/// index in the configuration.
pub struct FairShare {
    core: Mutex<Core>,
    /// The waiting receives' grant channels, by ticket.
    senders: Mutex<Vec<(Ticket, oneshot::Sender<usize>)>>,
    names: Vec<String>,
}

impl FairShare {
    pub fn new(capacity: usize, queues: &[(String, u32)]) -> FairShare {
        let weights: Vec<u32> = queues.iter().map(|(_, w)| *w).collect();
        FairShare {
            core: Mutex::new(Core::new(capacity, &weights)),
            senders: Mutex::new(Vec::new()),
            names: queues.iter().map(|(n, _)| n.clone()).collect(),
        }
    }

    /// Room for up to `want` leases for queue `lane`, waiting until
    /// `deadline` for it; 0 when the deadline passed first. The caller
    /// [`release`](Self::release)s what it was granted once it has leased.
    pub async fn acquire(&self, lane: usize, want: usize, deadline: tokio::time::Instant) -> usize {
        let (ticket, mut rx) = {
            let mut core = self.core.lock().unwrap();
            if let Some(n) = core.admit(want) {
                return n;
            }
            let ticket = core.enqueue(lane, want);
            let (tx, rx) = oneshot::channel();
            self.senders.lock().unwrap().push((ticket, tx));
            // Room may have been left by grants to receives that went away.
            self.send(&mut core);
            (ticket, rx)
        };
        metrics::counter!("dispatcher_fair_waits_total", "queue" => self.names[lane].clone())
            .increment(1);
        if let Ok(Ok(n)) = tokio::time::timeout_at(deadline, &mut rx).await {
            return n;
        }
        let mut core = self.core.lock().unwrap();
        if core.cancel(lane, ticket) {
            self.senders.lock().unwrap().retain(|(t, _)| *t != ticket);
            0
        } else {
            // Granted while timing out: keep it.
            rx.try_recv().unwrap_or(0)
        }
    }

    /// A receive is done leasing with what it was granted.
    pub fn release(&self, granted: usize) {
        if granted == 0 {
            return;
        }
        let mut core = self.core.lock().unwrap();
        core.release(granted);
        self.send(&mut core);
    }

    /// Leases came (positive) or went (negative) in some partition.
    pub fn in_flight_changed(&self, delta: isize) {
        let mut core = self.core.lock().unwrap();
        core.in_flight_changed(delta);
        if delta < 0 {
            self.send(&mut core);
        }
    }

    pub fn in_flight(&self) -> usize {
        self.core.lock().unwrap().in_flight()
    }

    /// Distributes the free room and sends each grant; a grant whose
    /// receive is gone is taken back and handed out again.
    fn send(&self, core: &mut Core) {
        loop {
            let grants = core.distribute();
            if grants.is_empty() {
                return;
            }
            let mut senders = self.senders.lock().unwrap();
            for (_, ticket, n) in grants {
                let Some(i) = senders.iter().position(|(t, _)| *t == ticket) else {
                    core.release(n);
                    continue;
                };
                let (_, tx) = senders.swap_remove(i);
                if tx.send(n).is_err() {
                    core.release(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants per lane when the room freed one lease at a time is handed out
    /// `rounds` times, every lane always having receives (each wanting
    /// `want`) waiting.
    fn shares(weights: &[u32], waiters: &[usize], want: usize, rounds: usize) -> Vec<usize> {
        let mut core = Core::new(10, weights);
        core.in_flight_changed(10);
        for (lane, &n) in waiters.iter().enumerate() {
            for _ in 0..n {
                core.enqueue(lane, want);
            }
        }
        let mut got = vec![0; weights.len()];
        for _ in 0..rounds {
            // One lease ends; whoever is granted leases what it got and
            // queues again (a busy poller).
            core.in_flight_changed(-1);
            for (lane, _, n) in core.distribute() {
                got[lane] += n;
                core.release(n);
                core.in_flight_changed(n as isize);
                core.enqueue(lane, want);
            }
        }
        got
    }

    #[test]
    fn many_pollers_do_not_starve_few() {
        let got = shares(&[1, 1], &[500, 5], 1, 2000);
        assert_eq!(got[0] + got[1], 2000);
        // Equal weights: equal shares, whatever the number of pollers.
        assert_eq!(got[0], 1000, "{got:?}");
        assert_eq!(got[1], 1000, "{got:?}");
    }

    #[test]
    fn shares_follow_the_weights() {
        let got = shares(&[1, 3], &[500, 5], 1, 4000);
        assert_eq!(got, vec![1000, 3000]);
        let got = shares(&[2, 1, 1], &[50, 50, 5], 1, 4000);
        assert_eq!(got, vec![2000, 1000, 1000]);
        // A queue with one receive waiting has no more to ask for in its
        // turn: the turn passes on (work-conserving), one lease per round.
        let got = shares(&[1, 1], &[50, 1], 1, 1100);
        assert_eq!(got, vec![1000, 100]);
    }

    #[test]
    fn a_lane_without_demand_gives_its_turn_away() {
        let mut core = Core::new(100, &[1, 1]);
        core.in_flight_changed(100);
        core.enqueue(1, 5);
        core.in_flight_changed(-50);
        let grants = core.distribute();
        assert_eq!(grants.len(), 1);
        assert_eq!((grants[0].0, grants[0].2), (1, 5));
        assert_eq!(core.free(), 45);
    }

    #[test]
    fn big_receives_are_granted_in_quanta() {
        let mut core = Core::new(1000, &[1, 1]);
        core.in_flight_changed(1000);
        core.enqueue(0, 100);
        core.enqueue(0, 100);
        core.enqueue(1, 100);
        core.in_flight_changed(-30);
        let grants: Vec<(usize, usize)> = core
            .distribute()
            .into_iter()
            .map(|(l, _, n)| (l, n))
            .collect();
        // Lane 0's turn is one quantum; then lane 1's.
        assert_eq!(grants, vec![(0, 10), (1, 10), (0, 10)]);
    }

    #[test]
    fn newcomers_wait_behind_the_line_and_room_is_not_overgranted() {
        let mut core = Core::new(10, &[1]);
        assert_eq!(core.admit(4), Some(4));
        assert_eq!(core.admit(10), Some(6));
        assert_eq!(core.admit(1), None);
        core.release(10);
        core.in_flight_changed(10);
        let t = core.enqueue(0, 3);
        core.in_flight_changed(-2);
        // Room, but someone waits: no overtaking.
        assert_eq!(core.admit(1), None);
        assert_eq!(core.distribute(), vec![(0, t, 2)]);
        assert_eq!(core.free(), 0);
        assert!(!core.cancel(0, t));
    }

    #[test]
    fn a_cancelled_receive_leaves_the_line() {
        let mut core = Core::new(1, &[1, 1]);
        core.in_flight_changed(1);
        let a = core.enqueue(0, 1);
        let b = core.enqueue(1, 1);
        assert!(core.cancel(0, a));
        core.in_flight_changed(-1);
        assert_eq!(core.distribute(), vec![(1, b, 1)]);
    }

    #[tokio::test]
    async fn room_granted_to_a_receive_that_went_away_goes_to_the_next() {
        let fair = std::sync::Arc::new(FairShare::new(1, &[("a".into(), 1), ("b".into(), 1)]));
        let later = || tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        fair.in_flight_changed(1);
        let gone = {
            let fair = fair.clone();
            tokio::spawn(async move { fair.acquire(0, 1, later()).await })
        };
        let next = {
            let fair = fair.clone();
            tokio::spawn(async move { fair.acquire(1, 1, later()).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // The first in line stops waiting (its client went away) without
        // taking itself out of the line.
        gone.abort();
        let _ = gone.await;
        fair.in_flight_changed(-1);
        assert_eq!(next.await.unwrap(), 1);
        assert_eq!(
            fair.core.lock().unwrap().free(),
            0,
            "granted once, not twice"
        );
    }

    #[tokio::test]
    async fn waiting_receives_are_woken_by_freed_room_or_their_deadline() {
        let fair = std::sync::Arc::new(FairShare::new(2, &[("a".into(), 1), ("b".into(), 1)]));
        let now = tokio::time::Instant::now;
        assert_eq!(fair.acquire(0, 2, now()).await, 2);
        fair.in_flight_changed(2);
        fair.release(2);
        // Full: a receive with no time to wait gets nothing.
        assert_eq!(fair.acquire(1, 1, now()).await, 0);
        let waiter = {
            let fair = fair.clone();
            tokio::spawn(async move {
                fair.acquire(1, 5, now() + std::time::Duration::from_secs(10))
                    .await
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        fair.in_flight_changed(-1);
        assert_eq!(waiter.await.unwrap(), 1);
    }
}
