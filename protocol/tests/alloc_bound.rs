//! A hostile frame of about 100 bytes must not make decoding allocate more
//! than a small bound, whatever counts it declares. Measured with a counting
//! global allocator, which is why this is its own test binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use protocol::{decode_request, RequestError};

struct Counting;

static ALLOCATED_BYTES: AtomicUsize = AtomicUsize::new(0);
static LARGEST_BYTES: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)] // a GlobalAlloc impl is unsafe by definition; it only counts
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size(), Ordering::SeqCst);
        LARGEST_BYTES.fetch_max(layout.size(), Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn header(api_key: i16, api_version: i16, flexible: bool) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&api_key.to_be_bytes());
    out.extend_from_slice(&api_version.to_be_bytes());
    out.extend_from_slice(&7i32.to_be_bytes());
    out.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
    if flexible {
        out.push(0); // no tagged fields
    }
    out
}

/// Frames that each declare far more elements than their ~100 bytes hold.
fn hostile_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    // Produce v3: acks, timeout, then topic_data count i32::MAX.
    let mut f = header(0, 3, false);
    f.extend_from_slice(&(-1i16).to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes());
    f.extend_from_slice(&1000i32.to_be_bytes());
    f.extend_from_slice(&i32::MAX.to_be_bytes());
    frames.push(f);
    // Produce v9 (flexible): compact topic_data count u32::MAX.
    let mut f = header(0, 9, true);
    f.push(0); // null transactional id
    f.extend_from_slice(&(-1i16).to_be_bytes());
    f.extend_from_slice(&1000i32.to_be_bytes());
    f.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
    frames.push(f);
    // Fetch v4: one topic whose partitions count is i32::MAX.
    let mut f = header(1, 4, false);
    f.extend_from_slice(&[0xFF; 4]); // replica id
    f.extend_from_slice(&[0; 12]); // max wait, min bytes, max bytes
    f.push(0); // isolation level
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&[0, 1, b't']);
    f.extend_from_slice(&i32::MAX.to_be_bytes());
    frames.push(f);
    // CreateTopics v5: one topic with a huge compact configs count.
    let mut f = header(19, 5, true);
    f.push(2); // one topic
    f.extend_from_slice(&[2, b't']);
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes());
    f.push(1); // no assignments
    f.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x07]);
    frames.push(f);
    // Metadata v12: tagged field count u32::MAX.
    let mut f = header(3, 12, true);
    f.push(0); // null topics
    f.push(1); // allow auto topic creation
    f.push(0); // include topic authorized operations
    f.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
    frames.push(f);
    for f in &mut frames {
        f.resize(100, 0x7F);
    }
    frames
}

#[test]
fn hostile_100_byte_frames_allocate_little() {
    for frame in hostile_frames() {
        let frame = Bytes::from(frame);
        let before = ALLOCATED_BYTES.load(Ordering::SeqCst);
        LARGEST_BYTES.store(0, Ordering::SeqCst);
        let result = decode_request(frame.clone());
        let allocated = ALLOCATED_BYTES.load(Ordering::SeqCst) - before;
        let largest = LARGEST_BYTES.load(Ordering::SeqCst);
        assert!(
            matches!(result, Err(RequestError::Malformed { .. })),
            "{frame:?}: {result:?}"
        );
        // The error message is the only allocation proportional to anything.
        assert!(
            allocated < 16 * 1024,
            "{allocated} bytes allocated for {frame:?}"
        );
        assert!(
            largest < 4 * 1024,
            "a {largest}-byte allocation for {frame:?}"
        );
    }
}
