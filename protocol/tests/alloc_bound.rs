//! A hostile frame of about 100 bytes must not make decoding allocate more
//! than a small bound, whatever counts it declares; and what the guard says
//! decoding will allocate (`CheckedRequest::decoded_bytes`, which the broker
//! charges to its memory budget) covers what decoding does allocate.
//! Measured with a counting global allocator, which is why this is its own
//! test binary; the tests take `SERIAL` so they do not count each other.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use protocol::versions::SUPPORTED_APIS;
use protocol::{check_request, decode_request, RequestError};

static SERIAL: Mutex<()> = Mutex::new(());

struct Counting;

static ALLOCATED_BYTES: AtomicUsize = AtomicUsize::new(0);
static LARGEST_BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's allocations, so the harness's own do not count.
    static THREAD_ALLOCATED_BYTES: Cell<usize> = const { Cell::new(0) };
}

#[allow(unsafe_code)] // a GlobalAlloc impl is unsafe by definition; it only counts
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size(), Ordering::SeqCst);
        LARGEST_BYTES.fetch_max(layout.size(), Ordering::SeqCst);
        let _ = THREAD_ALLOCATED_BYTES.try_with(|c| c.set(c.get() + layout.size()));
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
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

/// Bytes this thread allocated while `f` ran.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = THREAD_ALLOCATED_BYTES.with(Cell::get);
    let out = f();
    (out, THREAD_ALLOCATED_BYTES.with(Cell::get) - before)
}

#[test]
fn decoded_bytes_cover_what_decoding_allocates() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for api in SUPPORTED_APIS {
        for v in api.min_accepted_version..=api.max_version {
            let (frame, _) = common::encode(api.api_key, v, &common::build(api.api_key, v));
            let checked = check_request(frame).expect("accepted");
            let promised = checked.decoded_bytes() as usize;
            let (request, allocated) = allocated_by(|| checked.decode());
            request.unwrap_or_else(|e| panic!("{:?} v{v}: {e}", api.api_key));
            assert!(
                allocated <= promised,
                "{:?} v{v}: decoding allocated {allocated} bytes, the guard said {promised}",
                api.api_key
            );
        }
    }
}

/// Metadata v9 (flexible, before topic ids) naming `n` empty topics: two
/// bytes on the wire per topic.
fn metadata_of_empty_names(n: usize) -> Bytes {
    let mut f = BytesMut::new();
    f.put_i16(ApiKey::Metadata as i16);
    f.put_i16(9);
    f.put_i32(1);
    f.put_i16(-1); // null client id
    f.put_u8(0); // header tagged fields
    let mut count = n as u32 + 1;
    while count >= 0x80 {
        f.put_u8((count as u8 & 0x7F) | 0x80);
        count >>= 7;
    }
    f.put_u8(count as u8);
    for _ in 0..n {
        f.put_u8(1); // empty compact string
        f.put_u8(0); // no tagged fields
    }
    f.put_u8(1); // allow auto topic creation
    f.put_u8(0); // include cluster authorized operations
    f.put_u8(0); // include topic authorized operations
    f.put_u8(0); // tagged fields
    f.freeze()
}

#[test]
fn a_request_of_many_small_entries_is_charged_its_decoded_size() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 100_000;
    let frame = metadata_of_empty_names(n);
    let checked = check_request(frame.clone()).expect("accepted");
    let element =
        std::mem::size_of::<kafka_protocol::messages::metadata_request::MetadataRequestTopic>();
    // Far more than the frame: the charge is what memory the decoded
    // request takes, not its wire size.
    assert!(checked.decoded_bytes() as usize >= n * element);
    assert!(checked.decoded_bytes() as usize > 20 * frame.len());
    let (request, allocated) = allocated_by(|| checked.decode());
    request.expect("decodes");
    assert!(allocated >= n * element);
    assert!(allocated <= n * element + 1024);
}

/// Every single-byte mutation of every served request at its newest version
/// that the guard still accepts (other counts, other tags, unknown tagged
/// fields): decoding stays within what the guard said.
#[test]
fn decoded_bytes_cover_mutated_requests() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut accepted = 0;
    for api in SUPPORTED_APIS {
        let v = api.max_version;
        let (frame, header_len) = common::encode(api.api_key, v, &common::build(api.api_key, v));
        for at in header_len..frame.len() {
            for value in [0u8, 1, 2, 3, 0x7F, 0x80, 0xFF] {
                let mut mutated = frame.to_vec();
                mutated[at] = value;
                let Ok(checked) = check_request(Bytes::from(mutated)) else {
                    continue;
                };
                let promised = checked.decoded_bytes() as usize;
                let (request, allocated) = allocated_by(|| checked.decode());
                if request.is_ok() {
                    accepted += 1;
                    assert!(
                        allocated <= promised,
                        "{:?} v{v}, byte {at} = {value:#x}: allocated {allocated}, promised {promised}",
                        api.api_key
                    );
                }
            }
        }
    }
    assert!(accepted > 1000, "only {accepted} mutations decoded");
}

fn put_varint(f: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        f.put_u8((v as u8 & 0x7F) | 0x80);
        v >>= 7;
    }
    f.put_u8(v as u8);
}

#[test]
fn many_unknown_tagged_fields_stay_within_the_charge() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (n, descending) in [(1u32, false), (10, false), (10_000, false), (10_000, true)] {
        // Metadata v12, no topics, then `n` empty tagged fields of unknown tags.
        let mut f = BytesMut::new();
        f.put_i16(ApiKey::Metadata as i16);
        f.put_i16(12);
        f.put_i32(1);
        f.put_i16(-1);
        f.put_u8(0);
        f.put_u8(0); // null topics
        f.put_u8(1);
        f.put_u8(0);
        put_varint(&mut f, n);
        for i in 0..n {
            put_varint(&mut f, 100 + if descending { n - i } else { i });
            f.put_u8(0);
        }
        let checked = check_request(f.freeze()).expect("accepted");
        let promised = checked.decoded_bytes() as usize;
        let (request, allocated) = allocated_by(|| checked.decode());
        request.expect("decodes");
        assert!(
            allocated <= promised,
            "{n} tags: allocated {allocated}, promised {promised}"
        );
    }
}
