//! `protocol::fuzzing::request_body`, plus a bound on what decoding costs:
//! the heap a decoded request takes at its peak, against its wire size.
//! The guard keeps kafka-protocol from allocating from declared counts, so
//! what remains is the decoded form's own size; a body past the bound is a
//! request whose decoded form the broker's memory budget must charge for.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes a decoded request may take per byte of its frame, plus a
/// constant for the fixed parts. See protocol::fuzzing::DECODED_BYTES_PER_WIRE_BYTE.
use protocol::fuzzing::{DECODED_BYTES_FIXED, DECODED_BYTES_PER_WIRE_BYTE};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some(frame) = protocol::fuzzing::request_body_frame(data) else {
        return;
    };
    let wire = frame.len();
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let decoded = protocol::decode_request(frame.clone());
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    if let Ok(request) = &decoded {
        if std::env::var_os("FUZZ_ALLOC_REPORT").is_some() {
            eprintln!(
                "alloc-ratio api={} v={} wire={wire} peak={peak} ratio={:.1}",
                request.api_key(),
                request.api_version(),
                peak as f64 / wire as f64
            );
        }
    }
    assert!(
        peak <= DECODED_BYTES_PER_WIRE_BYTE * wire + DECODED_BYTES_FIXED,
        "decoding {wire} bytes took {peak} bytes of heap ({:?})",
        decoded.as_ref().map(|r| (r.api_key(), r.api_version()))
    );
    drop(decoded);
    protocol::fuzzing::decode_frame(frame);
});
