//! Benchmark (not a test): what a partition's state costs a message on the
//! dispatcher's hot path (buffer, lease, ack, ack-log records), without
//! Kafka or the network.
//!
//! `cargo run --release -p dispatcher-sidecar --example lease_cycle [messages]`
//!
//! As in `bench/dispatcher.sh`: 16 workers each hold a batch of 100 leases,
//! and they take turns acking their batch and leasing the next, so about
//! 1,600 leases are in flight, and the partition's buffer of ready records
//! is kept full, as the dispatcher's fetch loop keeps it. Each batch's events
//! are drained and encoded as the dispatcher writes them to its ack log.
//! Prints nanoseconds a message for the best of five runs.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use dispatcher_sidecar::lease::{
    ConsumerSlot, LeaseConfig, PartitionLeases, QueuePartition, Receipt,
};
use dispatcher_sidecar::queue::message::Buffered;
use dispatcher_sidecar::queue::partition::PartitionState;

const WORKERS: usize = 16;
const BATCH: usize = 100;

fn run(messages: i64) -> (f64, usize) {
    let partition = QueuePartition {
        topic: 0,
        partition: 0,
    };
    let engine =
        PartitionLeases::new(partition, LeaseConfig::default(), 0).expect("defaults are valid");
    let mut state = PartitionState::new(engine);
    let payload = Bytes::from(vec![b'x'; 1024]);
    let mut fetched = 0i64;
    let mut held: VecDeque<Vec<Receipt>> = VecDeque::new();
    let mut bytes = 0usize;
    let now_ms = 1_000_000;
    let started = Instant::now();
    let lease_batch = |state: &mut PartitionState, fetched: &mut i64, worker: usize| {
        while state.prefetch_room() > 0 {
            let m = Buffered::new(
                "t",
                0,
                *fetched,
                None,
                payload.clone(),
                Vec::new(),
                0,
                false,
            );
            state.offer(*fetched, m);
            *fetched += 1;
        }
        state
            .lease(BATCH, ConsumerSlot(worker as u32), 60_000, now_ms)
            .into_iter()
            .map(|(g, _, _)| g.receipt)
            .collect::<Vec<_>>()
    };
    for w in 0..WORKERS {
        held.push_back(lease_batch(&mut state, &mut fetched, w));
    }
    let mut acked = 0i64;
    let mut turn = 0;
    while acked < messages {
        let batch = held.pop_front().expect("a worker holds a batch");
        for r in &batch {
            state.engine.ack(r).expect("leased");
            state.done(r.offset);
        }
        acked += batch.len() as i64;
        bytes += write_events(&mut state);
        held.push_back(lease_batch(&mut state, &mut fetched, turn % WORKERS));
        bytes += write_events(&mut state);
        turn += 1;
    }
    let ns = started.elapsed().as_nanos() as f64 / acked as f64;
    (ns, bytes)
}

/// Drains and encodes the partition's events as the dispatcher does for its
/// ack log; returns their bytes.
fn write_events(state: &mut PartitionState) -> usize {
    state
        .engine
        .drain_events()
        .iter()
        .map(|event| {
            let r = state.engine.encode(event);
            r.key.len() + r.value.len()
        })
        .sum()
}

fn main() {
    let messages: i64 = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("message count"))
        .unwrap_or(2_000_000);
    let mut best = f64::MAX;
    let mut bytes = 0;
    for _ in 0..5 {
        let (ns, b) = run(messages);
        best = best.min(ns);
        bytes = b;
    }
    println!(
        "lease + ack + ack-log encoding: {best:.1} ns a message (best of 5 runs of {messages}; {:.1} ack-log bytes a message)",
        bytes as f64 / messages as f64
    );
}
