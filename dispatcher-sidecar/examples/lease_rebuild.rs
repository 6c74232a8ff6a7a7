//! Benchmark (not a test): how long a new owner takes to rebuild a
//! partition's lease state from 1M ack-log records (issue 7 target: 2 s).
//!
//! `cargo run --release -p dispatcher-sidecar --example lease_rebuild [records]`
//!
//! The records come from a live engine: one lease per message, acks trailing
//! by about a thousand messages and landing out of order in pairs, every 97th
//! message nacked and routed. Decoding is included in the time.

use std::collections::VecDeque;
use std::time::Instant;

use dispatcher_sidecar::lease::{
    decode_record, Available, ConsumerSlot, LeaseConfig, PartitionLeases, QueuePartition,
};

fn main() {
    let records_wanted: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("record count"))
        .unwrap_or(1_000_000);
    let partition = QueuePartition {
        topic: 0,
        partition: 0,
    };
    let config = LeaseConfig::default();
    let mut live = PartitionLeases::new(partition, config.clone(), 0).expect("defaults are valid");
    let mut records = Vec::with_capacity(records_wanted);
    let mut held = VecDeque::new();
    let mut offset = 0;
    while records.len() < records_wanted {
        let grants = live.lease(
            [Available::first(offset)],
            1,
            ConsumerSlot(0),
            60_000,
            offset,
        );
        held.push_back(grants[0].receipt);
        offset += 1;
        if held.len() > 1000 {
            let a = held.pop_front().expect("held");
            let b = held.pop_front().expect("held");
            live.ack(&b).expect("leased");
            if a.offset % 97 == 0 {
                let f = live.nack(&a, None, "x", false, offset).expect("leased");
                live.routed(f.offset).expect("pending");
            } else {
                live.ack(&a).expect("leased");
            }
        }
        for event in live.drain_events() {
            records.push(live.encode(&event));
        }
    }
    let started = Instant::now();
    let events = records
        .iter()
        .map(|r| decode_record(&r.key, &r.value).expect("records decode").1);
    let rebuilt = PartitionLeases::rebuild(partition, config, 0, events).expect("valid config");
    let elapsed = started.elapsed();
    assert_eq!(rebuilt.leases.committed_offset(), live.committed_offset());
    assert_eq!(rebuilt.expired.len(), live.in_flight_len());
    println!("| ack-log records | rebuild (decode + apply) | leases returned as expired |");
    println!("|---|---|---|");
    println!(
        "| {} | {:.1} ms | {} |",
        records.len(),
        elapsed.as_secs_f64() * 1e3,
        rebuilt.expired.len()
    );
}
