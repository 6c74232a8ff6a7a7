//! Compaction for `cleanup.policy=compact`, after Kafka's `LogCleaner`.
//!
//! The cleanable range is the closed segments wholly below the high
//! watermark (a newer value that replication may still truncate must not
//! remove an older one). A pass builds a map key -> latest offset over the
//! dirty part of that range (from where the previous pass stopped), then
//! rewrites the segments it covers keeping, per key, only the record at the
//! latest offset; tombstones go once `delete.retention.ms` has passed since
//! their timestamp. Offsets are preserved (gaps are normal), and each
//! rewritten segment replaces the old one by an atomic rename.
//!
//! A pass runs in three steps so that the log's lock is held only to look
//! and to swap: [`Log::compaction_plan`] (under the lock: which segments,
//! with their own file handles), [`CompactionJob::run`] (no lock: reads the
//! closed segments, writes fsynced `.cleaned` copies), [`Log::install`]
//! (under the lock: renames them in, unless retention, DeleteRecords or a
//! truncation changed the segments meanwhile, in which case the work is
//! thrown away). [`Log::compact`] runs the three in a row.
//!
//! Memory is bounded, whatever the records expand to:
//! - the map holds a 128-bit fingerprint of each key (BLAKE3 keyed with a
//!   secret drawn per pass, the key streamed through the hasher), not the
//!   key, and at most `log.cleaner.dedupe.buffer.size` bytes of entries; a
//!   pass whose dirty range has more keys cleans up to where the map filled
//!   and the next pass goes on from there, as Kafka's cleaner does. Two keys
//!   share a fingerprint with probability about n²/2¹²⁹ for n keys in a pass
//!   (10⁻²¹ for a billion), and since the secret is unknown and changes
//!   every pass nobody can aim a collision at another producer's key
//!   (Kafka's MD5 fingerprints can be).
//! - records are streamed, never held: a batch whose records all stay or
//!   all go is copied or dropped without decoding its values, and a batch
//!   that keeps some records is rebuilt by streaming their raw bytes into the
//!   codec, capped at the larger of its size and `max.message.bytes`. A
//!   rebuild that would exceed that keeps the batch unchanged (the cleaner
//!   errs on the side of keeping data), counted in
//!   `kafka_log_cleaner_batches_kept_whole_total`.
//!
//! Transactions: a batch of an aborted transaction (the partition hands the
//! job its aborted list, [`CompactionJob::with_aborted_transactions`]) is
//! removed whole, as Kafka's cleaner does, except for the header of a
//! producer's last batch. Deliberate simplifications, all on the side of
//! keeping data: committed transactional batches and markers are kept whole
//! and do not enter the key map (Kafka dedupes the former and removes a
//! marker once its transaction's data is gone and `delete.retention.ms`
//! has passed); the cleaner's progress is kept in memory only (a restart
//! cleans from the log start again); segments are not merged.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use protocol::record_batch::RecordBatchView;

use super::records::{self, BatchHeader, KeyHash, Retained};
use super::segment::{log_path, Segment, SegmentReader};
use super::{sync_dir, Log, LogError, CLEANED_SUFFIX};
use crate::types::Offset;

/// What one key costs in the map, counted against
/// `log.cleaner.dedupe.buffer.size`: a 16-byte fingerprint and an 8-byte
/// offset, doubled for the hash table's spare capacity and control bytes.
pub const DEDUPE_ENTRY_BYTES: u64 = 48;

fn corrupt_batch(view: &RecordBatchView<'_>, reason: String) -> LogError {
    LogError::CorruptBatch {
        base_offset: Offset(view.base_offset()),
        reason,
    }
}

/// Batches whose records the cleaner may drop.
fn is_cleanable_batch(view: &RecordBatchView<'_>) -> bool {
    !view.is_control() && !view.is_transactional()
}

/// Calls `f` with each batch of the segment, in order; a batch is in memory
/// one at a time (as stored: at most its own size).
fn for_each_batch(
    seg: &SegmentReader,
    mut f: impl FnMut(&RecordBatchView<'_>) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let mut position = 0;
    while let Some(h) = seg.header_at(position)? {
        let bytes = seg.read_at(position, h.size_bytes)?;
        let view = RecordBatchView::parse(&bytes)?;
        f(&view)?;
        position += h.size_bytes;
    }
    Ok(())
}

/// Latest offset per key fingerprint, bounded in entries.
struct OffsetMap {
    latest: HashMap<KeyHash, i64>,
    max_keys: usize,
}

impl OffsetMap {
    fn new(dedupe_buffer_bytes: u64) -> Self {
        Self {
            latest: HashMap::new(),
            max_keys: (dedupe_buffer_bytes / DEDUPE_ENTRY_BYTES).max(1) as usize,
        }
    }

    /// Records `offset` for `key`; false (and nothing recorded) when the key
    /// is new and the map is full.
    fn put(&mut self, key: KeyHash, offset: i64) -> bool {
        if let Some(latest) = self.latest.get_mut(&key) {
            *latest = offset;
            return true;
        }
        if self.latest.len() >= self.max_keys {
            return false;
        }
        self.latest.insert(key, offset);
        true
    }

    fn superseded(&self, key: &KeyHash, offset: i64) -> bool {
        self.latest.get(key).is_some_and(|&l| l > offset)
    }
}

/// A planned cleaning pass: the segments to read, as they were when
/// planned. Runs without the log; see [`Log::compaction_plan`].
pub struct CompactionJob {
    dir: PathBuf,
    dir_failure: super::LogDirFailureChannel,
    generation: u64,
    now_ms: i64,
    delete_retention_ms: i64,
    index_interval_bytes: u32,
    max_message_bytes: u32,
    dedupe_buffer_bytes: u64,
    /// The closed segments below the high watermark, oldest first.
    cleanable: Vec<SegmentReader>,
    /// The segments after them, up to their size when planned: where each
    /// producer's last batch is.
    later: Vec<SegmentReader>,
    /// Everything below this was cleaned by an earlier pass.
    dirty_from: i64,
    /// Where the uncleanable part of the log starts.
    end: i64,
    /// Aborted transactions whose marker is below the high watermark, per
    /// producer, as (first offset, marker offset) in marker order.
    aborted: HashMap<i64, Vec<(i64, i64)>>,
}

/// One aborted transaction: `producer_id`'s batches from `first_offset` to
/// its abort marker at `last_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbortedRange {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
}

/// A cleaned segment waiting to be swapped in.
enum CleanedSegment {
    Unchanged,
    /// `segment` is open on `cleaned_path`, to be renamed over the original.
    Replaced {
        segment: Segment,
        cleaned_path: PathBuf,
    },
    /// Nothing is left in it (never the log's first segment).
    Removed,
}

/// What a finished [`CompactionJob`] produced, for [`Log::install`].
/// Dropped without being installed, it removes its `.cleaned` files.
pub struct Cleaned {
    dir: PathBuf,
    generation: u64,
    /// The first `segments.len()` segments of the log as planned.
    segments: Vec<(i64, CleanedSegment)>,
    cleaned_up_to: i64,
    next_tombstone_expiry_ms: Option<i64>,
    /// Batches kept unchanged because their rebuild exceeded its bound.
    pub batches_kept_whole: u64,
    /// Whether the key map filled before the end of the dirty range.
    pub dedupe_map_full: bool,
}

impl Drop for Cleaned {
    fn drop(&mut self) {
        for (_, s) in &self.segments {
            if let CleanedSegment::Replaced { cleaned_path, .. } = s {
                // Best effort: open() removes `.cleaned` leftovers anyway.
                let _ = fs::remove_file(cleaned_path);
            }
        }
    }
}

/// A segment's newest record time, or its creation time when no record has
/// one (Kafka falls back to the file's modification time).
fn largest_timestamp(seg: &Segment) -> i64 {
    match seg.max_timestamp() {
        t if t >= 0 => t,
        _ => seg.created_ms,
    }
}

impl Log {
    /// Number of leading segments the cleaner may rewrite, and the offset
    /// where the uncleanable part of the log begins: the closed segments
    /// below the high watermark, up to the first one holding a record newer
    /// than `min.compaction.lag.ms` (Kafka's first uncleanable offset).
    fn cleanable_range(&self, now_ms: i64, high_watermark: i64) -> (usize, i64) {
        let lag = self.config.min_compaction_lag_ms;
        let mut n = 0;
        while n + 1 < self.segments.len()
            && self.segments[n + 1].base_offset <= high_watermark
            && (lag <= 0 || now_ms.saturating_sub(largest_timestamp(&self.segments[n])) >= lag)
        {
            n += 1;
        }
        (n, self.segments[n].base_offset)
    }

    /// Whether a pass is due (Kafka's `LogCleanerManager` choice): there is
    /// cleanable dirty data and either it is at least
    /// `min.cleanable.dirty.ratio` of the cleanable log or its oldest
    /// segment waited longer than `max.compaction.lag.ms`; or a kept
    /// tombstone has expired.
    pub(super) fn needs_compaction(&self, now_ms: i64, high_watermark: i64) -> bool {
        let (n, end) = self.cleanable_range(now_ms, high_watermark);
        if n == 0 {
            return false;
        }
        if self.next_tombstone_expiry_ms.is_some_and(|t| now_ms >= t) {
            return true;
        }
        let dirty_from = self.cleaned_up_to.max(self.log_start_offset);
        if end <= dirty_from {
            return false;
        }
        let (mut clean, mut dirty, mut oldest_dirty) = (0u64, 0u64, None);
        for (i, seg) in self.segments[..n].iter().enumerate() {
            if self.segments[i + 1].base_offset > dirty_from {
                dirty += seg.size_bytes();
                oldest_dirty.get_or_insert(seg);
            } else {
                clean += seg.size_bytes();
            }
        }
        let ratio_met = u128::from(dirty) * 1_000_000
            >= u128::from(self.config.min_cleanable_dirty_ppm) * u128::from(clean + dirty);
        let overdue = self.config.max_compaction_lag_ms < i64::MAX
            && oldest_dirty.is_some_and(|seg| {
                let first = seg
                    .first_batch_max_timestamp()
                    .filter(|t| *t >= 0)
                    .unwrap_or(seg.created_ms);
                now_ms.saturating_sub(first) > self.config.max_compaction_lag_ms
            });
        ratio_met || overdue
    }

    /// Plans a cleaning pass over the closed segments below
    /// `high_watermark`, or `None` when the topic is not compacted or a pass
    /// would do nothing. Cheap: it takes a file handle per segment. The job
    /// runs without the log ([`CompactionJob::run`]); its result goes back
    /// through [`Log::install`].
    pub fn compaction_plan(
        &self,
        now_ms: i64,
        high_watermark: Offset,
    ) -> Result<Option<CompactionJob>, LogError> {
        self.check_online()?;
        let plan = self.plan_unchecked(now_ms, high_watermark);
        self.guard(plan)
    }

    fn plan_unchecked(
        &self,
        now_ms: i64,
        high_watermark: Offset,
    ) -> Result<Option<CompactionJob>, LogError> {
        if !self.config.cleanup_policy.compact || !self.needs_compaction(now_ms, high_watermark.0) {
            return Ok(None);
        }
        let (n, end) = self.cleanable_range(now_ms, high_watermark.0);
        let readers = |segs: &[Segment]| -> Result<Vec<SegmentReader>, LogError> {
            segs.iter()
                .map(|s| s.reader().map_err(LogError::from))
                .collect()
        };
        Ok(Some(CompactionJob {
            dir: self.dir.clone(),
            dir_failure: self.dir_failure.clone(),
            generation: self.generation,
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
            index_interval_bytes: self.config.index_interval_bytes,
            max_message_bytes: self.config.max_message_bytes,
            dedupe_buffer_bytes: self.config.cleaner_dedupe_buffer_bytes,
            cleanable: readers(&self.segments[..n])?,
            later: readers(&self.segments[n..])?,
            dirty_from: self.cleaned_up_to.max(self.log_start_offset),
            end,
            aborted: HashMap::new(),
        }))
    }

    /// Swaps a finished pass's segments in, unless the log's segments were
    /// removed, replaced or truncated since it was planned: then the work is
    /// discarded (its files removed) and `false` returned. Holds the log for
    /// renames and a directory fsync, nothing that reads the segments.
    pub fn install(&mut self, mut cleaned: Cleaned) -> Result<bool, LogError> {
        self.check_online()?;
        if cleaned.generation != self.generation || cleaned.dir != self.dir {
            return Ok(false);
        }
        let outcome = self.swap_in(&mut cleaned);
        self.generation += 1;
        self.guard(outcome)?;
        self.cleaned_up_to = cleaned.cleaned_up_to;
        self.next_tombstone_expiry_ms = cleaned.next_tombstone_expiry_ms;
        Ok(true)
    }

    fn swap_in(&mut self, cleaned: &mut Cleaned) -> Result<(), LogError> {
        let results = std::mem::take(&mut cleaned.segments);
        let n = results.len();
        let old: Vec<Segment> = self.segments.drain(..n).collect();
        let mut kept: Vec<Segment> = Vec::with_capacity(n);
        let mut failure = None;
        let mut pending = results.into_iter();
        for seg in old {
            let Some((base, result)) = pending.next() else {
                kept.push(seg);
                continue;
            };
            debug_assert_eq!(base, seg.base_offset);
            if failure.is_some() {
                kept.push(seg);
                if let CleanedSegment::Replaced { cleaned_path, .. } = result {
                    let _ = fs::remove_file(cleaned_path);
                }
                continue;
            }
            // The rename is the commit point: a crash before it leaves the
            // old segment and a `.cleaned` file that open() deletes. After an
            // I/O error the segment may be missing from the list; I/O errors
            // take the log offline, and reopening it finds the old or the
            // cleaned file, both complete.
            match result {
                CleanedSegment::Unchanged => kept.push(seg),
                CleanedSegment::Removed => {
                    let path = log_path(&self.dir, seg.base_offset);
                    drop(seg);
                    if let Err(e) = fs::remove_file(&path) {
                        failure = Some(e.into());
                    }
                }
                CleanedSegment::Replaced {
                    segment,
                    cleaned_path,
                } => {
                    let path = log_path(&self.dir, seg.base_offset);
                    drop(seg);
                    match fs::rename(&cleaned_path, &path) {
                        Ok(()) => kept.push(segment.moved_to(path)),
                        Err(e) => {
                            let _ = fs::remove_file(&cleaned_path);
                            failure = Some(e.into());
                        }
                    }
                }
            }
        }
        kept.append(&mut self.segments);
        self.segments = kept;
        if let Some(e) = failure {
            return Err(e);
        }
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// One cleaning pass over the closed segments below `high_watermark`,
    /// planned, run and installed in a row.
    pub fn compact(&mut self, now_ms: i64, high_watermark: Offset) -> Result<(), LogError> {
        let Some(job) = self.compaction_plan(now_ms, high_watermark)? else {
            return Ok(());
        };
        let cleaned = job.run()?;
        self.install(cleaned)?;
        Ok(())
    }
}

impl CompactionJob {
    /// Builds the key map and writes the cleaned segments (fsynced, under
    /// `.cleaned` names). Takes no lock: everything it reads is closed
    /// segments and the sizes they had when planned.
    /// The partition's aborted transactions, whose data this pass removes.
    /// Only those whose marker is below the high watermark may be given: a
    /// marker replication may still truncate decides nothing yet.
    /// `aborted` must be in marker order, as the partition keeps it.
    pub fn with_aborted_transactions(mut self, aborted: Vec<AbortedRange>) -> Self {
        self.aborted.clear();
        for a in aborted {
            self.aborted
                .entry(a.producer_id)
                .or_default()
                .push((a.first_offset, a.last_offset));
        }
        self
    }

    /// Whether `view` is data of an aborted transaction: a producer's
    /// transactions do not overlap, so the first of its markers above the
    /// batch is the only one that can cover it.
    fn is_aborted(&self, view: &RecordBatchView<'_>) -> bool {
        if !view.is_transactional() || view.is_control() {
            return false;
        }
        let Some(ranges) = self.aborted.get(&view.producer_id()) else {
            return false;
        };
        let base = view.base_offset();
        let i = ranges.partition_point(|&(_, last)| last <= base);
        ranges.get(i).is_some_and(|&(first, _)| first <= base)
    }

    pub fn run(self) -> Result<Cleaned, LogError> {
        self.run_unchecked().inspect_err(|e| {
            // An I/O error while cleaning takes the directory offline, as
            // one in the log itself does.
            if let LogError::Io(io) = e {
                self.dir_failure.fail(&self.dir, io);
            }
        })
    }

    fn run_unchecked(&self) -> Result<Cleaned, LogError> {
        if self.dir_failure.is_offline() {
            return Err(LogError::LogDirOffline {
                dir: self.dir.clone(),
            });
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| LogError::Io(std::io::Error::other(e)))?;

        // The last batch of every producer keeps at least its header, so the
        // producer's epoch and sequence can be rebuilt from the log
        // (Kafka's `isBatchLastRecordOfProducer`).
        let mut producer_last_offset: HashMap<i64, i64> = HashMap::new();
        for seg in self.cleanable.iter().chain(&self.later) {
            let mut position = 0;
            while let Some(h) = seg.header_at(position)? {
                if h.producer_id >= 0 {
                    producer_last_offset.insert(h.producer_id, h.last_offset());
                }
                position += h.size_bytes;
            }
        }

        let (map, map_end, dedupe_map_full) = self.build_offset_map(&secret)?;
        // The segments the map covers (some of the last one may lie beyond
        // it: those records are kept, their keys not being in the map).
        let covered = self
            .cleanable
            .iter()
            .take_while(|s| s.base_offset < map_end)
            .count();

        let mut cleaned = Cleaned {
            dir: self.dir.clone(),
            generation: self.generation,
            segments: Vec::with_capacity(covered),
            cleaned_up_to: map_end,
            next_tombstone_expiry_ms: None,
            batches_kept_whole: 0,
            dedupe_map_full,
        };
        for (i, seg) in self.cleanable[..covered].iter().enumerate() {
            let result = self.clean_segment(
                seg,
                i == 0,
                &map,
                &secret,
                &producer_last_offset,
                &mut cleaned,
            )?;
            cleaned.segments.push((seg.base_offset, result));
        }
        if cleaned.batches_kept_whole > 0 {
            metrics::counter!("kafka_log_cleaner_batches_kept_whole_total")
                .increment(cleaned.batches_kept_whole);
        }
        if dedupe_map_full {
            metrics::counter!("kafka_log_cleaner_dedupe_map_full_total").increment(1);
        }
        Ok(cleaned)
    }

    /// The key map over the dirty part of the cleanable range, the offset
    /// it covers up to, and whether it filled before the range's end.
    fn build_offset_map(&self, secret: &[u8; 32]) -> Result<(OffsetMap, i64, bool), LogError> {
        let mut map = OffsetMap::new(self.dedupe_buffer_bytes);
        let mut full_at: Option<i64> = None;
        'segments: for seg in &self.cleanable {
            let seg_end = self
                .cleanable
                .iter()
                .chain(&self.later)
                .find(|s| s.base_offset > seg.base_offset)
                .map_or(self.end, |s| s.base_offset);
            if seg_end <= self.dirty_from {
                continue;
            }
            let mut position = 0;
            while let Some(h) = seg.header_at(position)? {
                position += h.size_bytes;
                if h.last_offset() < self.dirty_from {
                    continue;
                }
                let bytes = seg.read_at(position - h.size_bytes, h.size_bytes)?;
                let view = RecordBatchView::parse(&bytes)?;
                if !is_cleanable_batch(&view) {
                    continue;
                }
                records::for_each_record(&view, secret, |r| {
                    if full_at.is_some() || r.offset < self.dirty_from {
                        return;
                    }
                    if let Some(key) = r.key {
                        if !map.put(key, r.offset) {
                            full_at = Some(r.offset);
                        }
                    }
                })
                .map_err(|e| corrupt_batch(&view, e))?;
                if full_at.is_some() {
                    break 'segments;
                }
            }
        }
        match full_at {
            // Kafka's rule when the map fills: clean up to the first record
            // it could not take; the next pass starts there.
            Some(offset) => Ok((map, offset.max(self.dirty_from + 1), true)),
            None => Ok((map, self.end, false)),
        }
    }

    /// Writes the cleaned copy of `seg` to `<base>.log.cleaned`, fsynced,
    /// and opens it; `Unchanged` when cleaning would change nothing.
    fn clean_segment(
        &self,
        seg: &SegmentReader,
        is_first: bool,
        map: &OffsetMap,
        secret: &[u8; 32],
        producer_last_offset: &HashMap<i64, i64>,
        cleaned: &mut Cleaned,
    ) -> Result<CleanedSegment, LogError> {
        let cleaned_path = self
            .dir
            .join(format!("{:020}.log{CLEANED_SUFFIX}", seg.base_offset));
        let mut changed = false;
        let mut written = 0u64;
        let result = (|| -> Result<(), LogError> {
            let mut out = BufWriter::new(fs::File::create(&cleaned_path)?);
            for_each_batch(seg, |view| {
                let new_bytes = self.clean_batch(
                    view,
                    map,
                    secret,
                    producer_last_offset,
                    cleaned,
                    &mut changed,
                )?;
                let bytes = new_bytes.as_deref().unwrap_or(view.as_bytes());
                out.write_all(bytes)?;
                written += bytes.len() as u64;
                Ok(())
            })?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            Ok(())
        })();
        if result.is_err() || !changed {
            let _ = fs::remove_file(&cleaned_path);
        }
        result?;
        if !changed {
            return Ok(CleanedSegment::Unchanged);
        }
        if written == 0 && !is_first {
            // The first segment is kept even when empty, so the log start
            // offset does not move.
            let _ = fs::remove_file(&cleaned_path);
            return Ok(CleanedSegment::Removed);
        }
        let load = Segment::load(
            cleaned_path.clone(),
            seg.base_offset,
            seg.base_offset,
            false,
            self.index_interval_bytes,
            self.now_ms,
        );
        match load {
            Ok((mut segment, _)) => {
                segment.created_ms = seg.created_ms;
                Ok(CleanedSegment::Replaced {
                    segment,
                    cleaned_path,
                })
            }
            Err(e) => {
                let _ = fs::remove_file(&cleaned_path);
                Err(e.into())
            }
        }
    }

    /// The batch's replacement (`None`: keep it as it is); an empty vector
    /// drops it.
    fn clean_batch(
        &self,
        view: &RecordBatchView<'_>,
        map: &OffsetMap,
        secret: &[u8; 32],
        producer_last_offset: &HashMap<i64, i64>,
        cleaned: &mut Cleaned,
        changed: &mut bool,
    ) -> Result<Option<Vec<u8>>, LogError> {
        if self.is_aborted(view) {
            *changed = true;
            return Ok(Some(emptied(view, producer_last_offset)));
        }
        if !is_cleanable_batch(view) {
            return Ok(None);
        }
        let now_ms = self.now_ms;
        let delete_retention_ms = self.delete_retention_ms;
        // A tombstone may go only when every older record of its key goes
        // in this pass: its offset is inside the map (so the map names it,
        // or something newer, for its key) and no earlier batch of the pass
        // was kept whole with superseded records still in it.
        let map_end = cleaned.cleaned_up_to;
        let tombstones_removable = cleaned.batches_kept_whole == 0;
        // Expiries of the tombstones this batch keeps; they count only if
        // the batch is cleaned as decided (not kept whole).
        let mut tombstone_expiry: Option<i64> = None;
        let keep = |r: &records::RecordSummary| -> bool {
            let Some(key) = r.key else {
                // Kafka's cleaner drops keyless records: they cannot be in a
                // compacted topic legitimately.
                return false;
            };
            if map.superseded(&key, r.offset) {
                return false;
            }
            if r.has_value {
                return true;
            }
            let expiry = r.timestamp.saturating_add(delete_retention_ms);
            if now_ms >= expiry {
                return !(tombstones_removable && r.offset < map_end);
            }
            tombstone_expiry = Some(tombstone_expiry.map_or(expiry, |t| t.min(expiry)));
            true
        };
        let max_len = view.as_bytes().len().max(self.max_message_bytes as usize);
        let retained =
            records::retain(view, secret, keep, max_len).map_err(|e| corrupt_batch(view, e))?;
        let replacement = match retained {
            Retained::All => None,
            Retained::KeptWhole => {
                cleaned.batches_kept_whole += 1;
                return Ok(None);
            }
            Retained::Nothing => {
                *changed = true;
                Some(emptied(view, producer_last_offset))
            }
            Retained::Some(batch) => {
                *changed = true;
                Some(batch)
            }
        };
        if let Some(t) = tombstone_expiry {
            cleaned.next_tombstone_expiry_ms =
                Some(cleaned.next_tombstone_expiry_ms.map_or(t, |c| c.min(t)));
        }
        Ok(replacement)
    }
}

/// A batch none of whose records stay: gone, unless it is its producer's
/// last, whose header stays so the producer's epoch and sequence can be
/// rebuilt from the log.
fn emptied(view: &RecordBatchView<'_>, producer_last_offset: &HashMap<i64, i64>) -> Vec<u8> {
    let h = BatchHeader::from_view(view);
    if h.producer_id >= 0 && producer_last_offset.get(&h.producer_id) == Some(&h.last_offset()) {
        records::empty_batch_like(view)
    } else {
        Vec::new()
    }
}
