//! What the log needs to know about the inside of a stored v2 batch: the
//! header fields it indexes, and the records (key, value, timestamp) that
//! timestamp lookups and the cleaner look at.
//!
//! Stored batches were validated (CRC, framing) before they were appended,
//! but the bytes still come from disk, so every length is checked before use
//! and nothing here panics on bad input. Records are only ever streamed
//! (`protocol::records`): no key, value or decompressed records section is
//! held whole, so what a batch expands to costs codec windows.

use std::io::{self, Write};

use protocol::record_batch::{
    i16_at, i32_at, i64_at, RecordBatchView, ATTR_COMPRESSION_MASK, HEADER_LEN, MAGIC_V2,
    OFF_ATTRIBUTES, OFF_BASE_OFFSET, OFF_BASE_TIMESTAMP, OFF_LAST_OFFSET_DELTA, OFF_LEADER_EPOCH,
    OFF_MAGIC, OFF_MAX_TIMESTAMP, OFF_PRODUCER_ID, OFF_RECORD_COUNT,
};
use protocol::records::{
    Part, RecordError, RecordReader, RecordVisitor, RecordsCompressor, SkipAll,
};

/// The header fields of one stored batch, read from its first
/// [`HEADER_LEN`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub base_offset: i64,
    /// The whole batch: `LOG_OVERHEAD + batchLength`.
    pub size_bytes: u64,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub attributes: i16,
    pub record_count: i32,
    /// The partition leader epoch the batch was written in (-1: none).
    pub leader_epoch: i32,
}

impl BatchHeader {
    /// `None` when the prefix cannot start a v2 batch (bad length, magic or
    /// offset delta), which recovery treats as corruption.
    pub fn parse(h: &[u8]) -> Option<Self> {
        if h.len() < HEADER_LEN {
            return None;
        }
        let size_bytes = RecordBatchView::peek_len(h)? as u64;
        if h[OFF_MAGIC] as i8 != MAGIC_V2 {
            return None;
        }
        let base_offset = i64_at(h, OFF_BASE_OFFSET);
        let last_offset_delta = i32_at(h, OFF_LAST_OFFSET_DELTA);
        let record_count = i32_at(h, OFF_RECORD_COUNT);
        // Offsets far from i64::MAX keep `base + delta + 1` from overflowing.
        if base_offset < 0
            || base_offset > i64::MAX - (i32::MAX as i64) - 1
            || last_offset_delta < 0
            || record_count < 0
        {
            return None;
        }
        Some(Self {
            base_offset,
            size_bytes,
            last_offset_delta,
            max_timestamp: i64_at(h, OFF_MAX_TIMESTAMP),
            producer_id: i64_at(h, OFF_PRODUCER_ID),
            attributes: i16_at(h, OFF_ATTRIBUTES),
            record_count,
            leader_epoch: i32_at(h, OFF_LEADER_EPOCH),
        })
    }

    pub fn from_view(view: &RecordBatchView<'_>) -> Self {
        Self::parse(view.as_bytes()).expect("a parsed batch has a valid header")
    }

    /// Wrapping, as [`RecordBatchView::last_offset`] does: a damaged header
    /// read during recovery must be refused, not panic the reader.
    pub fn last_offset(&self) -> i64 {
        self.base_offset.wrapping_add(self.last_offset_delta as i64)
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset().wrapping_add(1)
    }
}

/// A record's timestamp: its own for CreateTime batches; the batch's max
/// timestamp for every record of a LogAppendTime batch, as in Kafka.
pub(crate) fn record_timestamp(view: &RecordBatchView<'_>, timestamp_delta: i64) -> i64 {
    if view.is_log_append_time() {
        view.max_timestamp()
    } else {
        view.base_timestamp().wrapping_add(timestamp_delta)
    }
}

/// `(offset, timestamp)` of the first record, in batch order, for which
/// `wanted` holds. The records are streamed ([`RecordReader`]): keys and
/// values are skipped, never held, so a batch that expands to gigabytes
/// costs the codec's window.
pub(crate) fn find_record(
    view: &RecordBatchView<'_>,
    mut wanted: impl FnMut(i64, i64) -> bool,
) -> Result<Option<(i64, i64)>, String> {
    let mut reader = RecordReader::new(view).map_err(|e| e.to_string())?;
    while let Some(info) = reader
        .next_record(&mut SkipAll)
        .map_err(|e| e.to_string())?
    {
        let offset = view.base_offset() + info.offset_delta as i64;
        let timestamp = record_timestamp(view, info.timestamp_delta);
        if wanted(offset, timestamp) {
            return Ok(Some((offset, timestamp)));
        }
    }
    Ok(None)
}

/// A key's fingerprint in the cleaner's map: 128 bits of BLAKE3 keyed with
/// a secret drawn for each cleaning pass.
pub(crate) type KeyHash = [u8; 16];

/// What the cleaner looks at in one record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordSummary {
    pub offset: i64,
    pub timestamp: i64,
    /// `None` for a null key.
    pub key: Option<KeyHash>,
    /// `false` for a tombstone (null value).
    pub has_value: bool,
}

/// Hashes each record's key as its pieces stream past.
struct KeyHasher {
    hasher: blake3::Hasher,
}

impl RecordVisitor for KeyHasher {
    fn wants(&self, part: Part) -> bool {
        part == Part::Key
    }
    fn bytes(&mut self, _: Part, piece: &[u8]) {
        self.hasher.update(piece);
    }
}

/// Calls `f` with a summary of each record of the batch, in order, while
/// streaming it: keys are hashed piece by piece, values skipped.
pub(crate) fn for_each_record(
    view: &RecordBatchView<'_>,
    secret: &[u8; 32],
    mut f: impl FnMut(&RecordSummary),
) -> Result<(), String> {
    let mut reader = RecordReader::new(view).map_err(|e| e.to_string())?;
    loop {
        let mut keys = KeyHasher {
            hasher: blake3::Hasher::new_keyed(secret),
        };
        let Some(info) = reader.next_record(&mut keys).map_err(|e| e.to_string())? else {
            break;
        };
        let key = (info.key_len >= 0).then(|| {
            let mut hash = [0u8; 16];
            hash.copy_from_slice(&keys.hasher.finalize().as_bytes()[..16]);
            hash
        });
        f(&RecordSummary {
            offset: view.base_offset() + info.offset_delta as i64,
            timestamp: record_timestamp(view, info.timestamp_delta),
            key,
            has_value: info.value_len >= 0,
        });
    }
    Ok(())
}

/// The most runs of consecutive kept (or dropped) records a batch may
/// alternate between for the cleaner to rebuild it (the runs are held in
/// memory between its two reads of the batch).
pub(crate) const MAX_RETAINED_RUNS: usize = 1 << 16;

/// What the cleaner makes of one batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Retained {
    /// Every record stays: the batch is kept byte for byte.
    All,
    /// No record stays.
    Nothing,
    /// The batch rebuilt with the records that stay.
    Some(Vec<u8>),
    /// Some records would go, but the rebuilt batch would exceed its bound
    /// (or the records alternate too often): the batch is kept unchanged.
    KeptWhole,
}

/// Copies the raw bytes of the records in the kept runs into a compressor.
struct CopyKept<'c> {
    out: &'c mut RecordsCompressor,
    keeping: bool,
}

impl RecordVisitor for CopyKept<'_> {
    fn wants_raw(&self) -> bool {
        self.keeping
    }
    fn raw(&mut self, piece: &[u8]) -> io::Result<()> {
        self.out.write_all(piece)
    }
}

/// The batch with only the records `keep` keeps, as Kafka's cleaner builds
/// it (`MemoryRecords.buildRetainedRecordsInto`): same base offset, last
/// offset delta, producer id, epoch and base sequence, so the producer's
/// last sequence survives cleaning; same codec; max timestamp recomputed for
/// CreateTime batches. Records are copied as encoded (their deltas are
/// relative to the unchanged base offset and base timestamp), streamed
/// from the first read into the codec, so a bomb never sits in memory; the
/// rebuilt batch may take at most `max_len` bytes.
///
/// The batch is read twice: once to decide (`keep` is called once per
/// record, in order), once to copy.
pub(crate) fn retain(
    view: &RecordBatchView<'_>,
    secret: &[u8; 32],
    mut keep: impl FnMut(&RecordSummary) -> bool,
    max_len: usize,
) -> Result<Retained, String> {
    // Runs of kept records: [start, end) record indexes.
    let mut runs: Vec<(u32, u32)> = Vec::new();
    let mut index = 0u32;
    let mut kept = 0u32;
    let mut max_timestamp = i64::MIN;
    for_each_record(view, secret, |r| {
        if keep(r) {
            match runs.last_mut() {
                Some((_, end)) if *end == index => *end += 1,
                _ => runs.push((index, index + 1)),
            }
            kept += 1;
            max_timestamp = max_timestamp.max(r.timestamp);
        }
        index += 1;
    })?;
    if kept == index {
        return Ok(Retained::All);
    }
    if kept == 0 {
        return Ok(Retained::Nothing);
    }
    if runs.len() > MAX_RETAINED_RUNS {
        return Ok(Retained::KeptWhole);
    }
    let codec = view.codec().map_err(|e| e.to_string())?;
    let payload_max = max_len.saturating_sub(HEADER_LEN);
    let mut out = RecordsCompressor::new(codec, payload_max).map_err(|e| e.to_string())?;
    let mut reader = RecordReader::new(view).map_err(|e| e.to_string())?;
    let mut runs = runs.into_iter().peekable();
    for i in 0..index {
        while runs.peek().is_some_and(|&(_, end)| end <= i) {
            runs.next();
        }
        let keeping = runs.peek().is_some_and(|&(start, _)| start <= i);
        let mut copy = CopyKept {
            out: &mut out,
            keeping,
        };
        match reader.next_record(&mut copy) {
            Ok(Some(_)) => {}
            Ok(None) => return Err("records changed between two reads".into()),
            Err(RecordError::Sink {
                kind: io::ErrorKind::WriteZero,
                ..
            }) => return Ok(Retained::KeptWhole),
            Err(e) => return Err(e.to_string()),
        }
    }
    let payload = match out.finish() {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::WriteZero => return Ok(Retained::KeptWhole),
        Err(e) => return Err(e.to_string()),
    };
    let mut batch = Vec::with_capacity(HEADER_LEN + payload.len());
    batch.extend_from_slice(&view.as_bytes()[..HEADER_LEN]);
    batch.extend_from_slice(&payload);
    if !view.is_log_append_time() {
        batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8]
            .copy_from_slice(&max_timestamp.to_be_bytes());
    }
    batch[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&(kept as i32).to_be_bytes());
    protocol::record_batch::rewrite::seal(&mut batch);
    Ok(Retained::Some(batch))
}

/// A batch header with no records, as Kafka's `DefaultRecordBatch.writeEmptyHeader`:
/// kept when the cleaner empties the last batch of a producer, so the
/// producer's epoch and last sequence are still in the log after a restart.
pub(crate) fn empty_batch_like(view: &RecordBatchView<'_>) -> Vec<u8> {
    let mut out = view.as_bytes()[..HEADER_LEN].to_vec();
    let attributes = view.attributes() & !ATTR_COMPRESSION_MASK;
    out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    let max_timestamp = view.max_timestamp();
    out[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    out[OFF_RECORD_COUNT..OFF_RECORD_COUNT + 4].copy_from_slice(&0i32.to_be_bytes());
    protocol::record_batch::rewrite::seal(&mut out);
    out
}
