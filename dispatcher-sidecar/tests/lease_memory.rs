//! Memory per in-flight lease (issue 7 target: at most 128 bytes).
//!
//! Its own test binary with one test, so the counting allocator sees only
//! this test's allocations. The allocator only forwards to `System` and adds
//! to two counters; that is the whole of the unsafe code here.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dispatcher_sidecar::lease::{
    Available, ConsumerSlot, LeaseConfig, PartitionLeases, QueuePartition,
};

struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static FREED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        FREED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        FREED.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live_bytes() -> usize {
    ALLOCATED.load(Ordering::Relaxed) - FREED.load(Ordering::Relaxed)
}

#[test]
fn an_in_flight_lease_costs_at_most_128_bytes() {
    const LEASES: i64 = 100_000;
    let mut e = PartitionLeases::new(
        QueuePartition {
            topic: 0,
            partition: 0,
        },
        LeaseConfig::default(),
        0,
    )
    .unwrap();
    let before = live_bytes();
    // Leased a few at a time with mixed expiries, as consumers pull them;
    // grants and events are handed off (dropped) as the runtime would.
    let mut offset = 0;
    while offset < LEASES {
        let batch: Vec<Available> = (offset..offset + 10).map(Available::first).collect();
        let now = offset * 7;
        let grants = e.lease(
            batch,
            10,
            ConsumerSlot(offset as u32 % 50),
            30_000 + (offset % 13) * 1_000,
            now,
        );
        assert_eq!(grants.len(), 10);
        drop(e.drain_events());
        offset += 10;
    }
    let per_lease = (live_bytes() - before) as f64 / LEASES as f64;
    eprintln!("{per_lease:.1} bytes per in-flight lease");
    assert_eq!(e.in_flight_len(), LEASES as usize);
    assert!(
        per_lease <= 128.0,
        "{per_lease:.1} bytes per in-flight lease"
    );
}
