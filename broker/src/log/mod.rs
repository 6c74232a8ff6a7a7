//! Per-partition log storage, after Kafka's `UnifiedLog`/`LogSegment`.
//!
//! A partition directory holds segments `<base_offset:020>.log`, each a run
//! of v2 record batches stored byte-for-byte as appended, plus
//! `log-start-offset` (the DeleteRecords/retention floor, written atomically)
//! and `clean-shutdown` (present only while the log is closed cleanly).
//!
//! Invariant: this module knows nothing about replication, producers or
//! clocks. Callers assign offsets, validate batches, and pass `now_ms`.
//! Offset and time indexes live in memory and are rebuilt on open from batch
//! headers (see `segment.rs`); nothing on disk but the `.log` files has to be
//! trusted.

mod cleaner;
mod dir_failure;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod records;
mod region;

pub use cleaner::{AbortedRange, Cleaned, CompactionJob, DEDUPE_ENTRY_BYTES};
pub use dir_failure::LogDirFailureChannel;
mod segment;
#[cfg(test)]
mod tests;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use protocol::record_batch::{BatchError, RecordBatchView};
use thiserror::Error;

use crate::types::{LeaderEpoch, Offset};
use records::BatchHeader;
pub use region::FileRegion;
use segment::{corrupt, Segment, LOG_SUFFIX};

const LOG_START_OFFSET_FILE: &str = "log-start-offset";
const CLEAN_SHUTDOWN_FILE: &str = "clean-shutdown";
const TMP_SUFFIX: &str = ".tmp";
/// What a partition directory being deleted is renamed to end with:
/// `<topic>-<partition>.<uuid>-delete`, as Kafka names it.
pub const DELETE_DIR_SUFFIX: &str = "-delete";
const CLEANED_SUFFIX: &str = ".cleaned";
/// Kafka's default `log.cleaner.dedupe.buffer.size`: 128 MiB.
pub const DEFAULT_CLEANER_DEDUPE_BUFFER_BYTES: u64 = 128 << 20;

/// Which of Kafka's `cleanup.policy` values apply; both may be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

impl Default for CleanupPolicy {
    fn default() -> Self {
        Self {
            delete: true,
            compact: false,
        }
    }
}

/// The topic-level configs that govern a partition's log, with Kafka's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`
    pub segment_bytes: u64,
    /// `segment.ms`
    pub segment_ms: i64,
    /// `segment.jitter.ms`: each segment rolls up to this much (drawn at
    /// random when it is created) before `segment.ms`.
    pub segment_jitter_ms: i64,
    /// `retention.ms`; -1 keeps data forever.
    pub retention_ms: i64,
    /// `retention.bytes`; -1 means no size limit.
    pub retention_bytes: i64,
    /// `cleanup.policy`
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long tombstones outlive compaction.
    pub delete_retention_ms: i64,
    /// `min.compaction.lag.ms`: a segment holding a newer record is not
    /// cleaned yet.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a dirty segment older than this is cleaned
    /// whatever the dirty ratio; a compacted log's active segment rolls
    /// after this long.
    pub max_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`, in millionths: the dirty share of the
    /// cleanable log a cleaning pass waits for.
    pub min_cleanable_dirty_ppm: u32,
    /// `index.interval.bytes`
    pub index_interval_bytes: u32,
    /// `flush.messages`; `u64::MAX` leaves flushing to the OS.
    pub flush_messages: u64,
    /// `flush.ms`; `i64::MAX` leaves flushing to the OS.
    pub flush_ms: i64,
    /// `max.message.bytes`: the largest batch `append` accepts.
    pub max_message_bytes: u32,
    /// `log.cleaner.dedupe.buffer.size` (a broker key): the most a cleaning
    /// pass's key map may take, at [`cleaner::DEDUPE_ENTRY_BYTES`] per key.
    pub cleaner_dedupe_buffer_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            segment_jitter_ms: 0,
            retention_ms: 7 * 24 * 60 * 60 * 1000,
            retention_bytes: -1,
            cleanup_policy: CleanupPolicy::default(),
            delete_retention_ms: 24 * 60 * 60 * 1000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ppm: 500_000,
            index_interval_bytes: 4096,
            flush_messages: u64::MAX,
            flush_ms: i64::MAX,
            max_message_bytes: 1_048_588,
            cleaner_dedupe_buffer_bytes: DEFAULT_CLEANER_DEDUPE_BUFFER_BYTES,
        }
    }
}

/// A [`LogConfig`] value Kafka would reject.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LogConfigError {
    #[error("segment.bytes {0} cannot hold a batch header")]
    SegmentBytesTooSmall(u64),
    #[error("segment.ms must be at least 1, got {0}")]
    SegmentMsTooSmall(i64),
    #[error("retention.ms must be -1 or more, got {0}")]
    RetentionMsInvalid(i64),
    #[error("retention.bytes must be -1 or more, got {0}")]
    RetentionBytesInvalid(i64),
    #[error("delete.retention.ms must be 0 or more, got {0}")]
    DeleteRetentionMsNegative(i64),
    #[error("flush.messages must be at least 1")]
    FlushMessagesZero,
    #[error("flush.ms must be 0 or more, got {0}")]
    FlushMsNegative(i64),
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), LogConfigError> {
        if self.segment_bytes < protocol::record_batch::HEADER_LEN as u64 {
            return Err(LogConfigError::SegmentBytesTooSmall(self.segment_bytes));
        }
        if self.segment_ms < 1 {
            return Err(LogConfigError::SegmentMsTooSmall(self.segment_ms));
        }
        if self.retention_ms < -1 {
            return Err(LogConfigError::RetentionMsInvalid(self.retention_ms));
        }
        if self.retention_bytes < -1 {
            return Err(LogConfigError::RetentionBytesInvalid(self.retention_bytes));
        }
        if self.delete_retention_ms < 0 {
            return Err(LogConfigError::DeleteRetentionMsNegative(
                self.delete_retention_ms,
            ));
        }
        if self.flush_messages == 0 {
            return Err(LogConfigError::FlushMessagesZero);
        }
        if self.flush_ms < 0 {
            return Err(LogConfigError::FlushMsNegative(self.flush_ms));
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum LogError {
    /// The disk failed or a file changed under us: the node must stop.
    #[error("log storage failed: {0}")]
    Io(#[from] io::Error),
    #[error("offset {requested} is outside the log [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        requested: Offset,
        log_start: Offset,
        log_end: Offset,
    },
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("batch base offset {base_offset} is not the log end offset {log_end}")]
    NonMonotonicOffset {
        base_offset: Offset,
        log_end: Offset,
    },
    #[error("batch of {size_bytes} bytes exceeds max.message.bytes {max_message_bytes}")]
    RecordBatchTooLarge {
        size_bytes: usize,
        max_message_bytes: u32,
    },
    /// A stored batch whose records cannot be decoded (only the cleaner and
    /// timestamp lookups look inside batches).
    #[error("stored batch at offset {base_offset} is corrupt: {reason}")]
    CorruptBatch { base_offset: Offset, reason: String },
    /// An earlier I/O error took the log directory offline
    /// ([`LogDirFailureChannel`]): nothing in it is written or read again.
    #[error("log directory of {dir} is offline after an I/O error")]
    LogDirOffline { dir: PathBuf },
}

/// What one `maintain` call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    pub rolled: bool,
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    pub compacted: bool,
    pub flushed: bool,
    pub log_start_offset: Offset,
}

pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    /// Ascending by base offset; never empty; the last is the active segment.
    segments: Vec<Segment>,
    log_start_offset: i64,
    unflushed_messages: u64,
    last_flush_ms: i64,
    /// Everything below this offset has been compacted with everything else
    /// below it (Kafka's cleaner checkpoint, kept in memory only).
    cleaned_up_to: i64,
    /// When the earliest tombstone the cleaner kept becomes removable.
    next_tombstone_expiry_ms: Option<i64>,
    /// Bumped whenever segments are removed, replaced or truncated, so a
    /// compaction planned before cannot install over them.
    generation: u64,
    /// The directory's health, shared with every log in it.
    dir_failure: LogDirFailureChannel,
    /// Mixed into each segment's `segment.jitter.ms` draw.
    jitter_seed: u64,
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `contents` so a crash leaves the old or the new
/// file, never a torn one.
fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Deletes a partition directory as Kafka's `LogManager.asyncDelete` does:
/// first renamed to `<name>.<uuid>-delete` (the parent fsynced), so a crash
/// at any later point cannot bring the partition back under its own name,
/// then removed by a background thread. A `-delete` directory left by a
/// crash is removed by the next start ([`remove_deleted_dirs`]).
pub fn delete_dir(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let renamed = rename_for_deletion(dir)?;
    static DELETER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<PathBuf>>> =
        std::sync::OnceLock::new();
    let deleter = DELETER.get_or_init(|| {
        // One thread removes every renamed directory in turn, however many
        // partitions a deletion takes.
        let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
        let spawned = std::thread::Builder::new()
            .name("log-delete".into())
            .spawn(move || {
                for dir in rx {
                    if let Err(e) = fs::remove_dir_all(&dir) {
                        tracing::warn!(dir = %dir.display(), error = %e, "removing a deleted partition failed");
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the log-delete thread");
        }
        std::sync::Mutex::new(tx)
    });
    let sent = deleter
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(renamed);
    if let Err(std::sync::mpsc::SendError(renamed)) = sent {
        // No thread: remove it here rather than leave it to the next start.
        fs::remove_dir_all(renamed)?;
    }
    Ok(())
}

/// The first half of [`delete_dir`]: the rename, durable once this returns.
pub fn rename_for_deletion(dir: &Path) -> io::Result<PathBuf> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| corrupt(format!("{}: not a partition directory", dir.display())))?;
    let parent = dir.parent().unwrap_or(Path::new("."));
    let renamed = parent.join(format!(
        "{name}.{}{DELETE_DIR_SUFFIX}",
        uuid::Uuid::new_v4().simple()
    ));
    fs::rename(dir, &renamed)?;
    sync_dir(parent)?;
    Ok(renamed)
}

/// Whether `name` is a partition directory renamed for deletion.
pub fn is_deleted_dir_name(name: &str) -> bool {
    name.strip_suffix(DELETE_DIR_SUFFIX)
        .and_then(|stem| stem.rsplit_once('.'))
        .is_some_and(|(_, id)| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes the `-delete` directories under `data_dir` that a crash left
/// behind (Kafka loads them at start only to delete them).
pub fn remove_deleted_dirs(data_dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in fs::read_dir(data_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_some_and(is_deleted_dir_name) && entry.file_type()?.is_dir() {
            // The background deletion of a directory renamed just now may
            // remove it (or files in it) first: gone is what we want.
            match fs::remove_dir_all(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

fn parse_segment_base(name: &str) -> Option<i64> {
    let stem = name.strip_suffix(LOG_SUFFIX)?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

fn read_log_start_offset(dir: &Path) -> io::Result<Option<i64>> {
    let path = dir.join(LOG_START_OFFSET_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => s
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|o| *o >= 0)
            .map(Some)
            .ok_or_else(|| corrupt(format!("{}: not an offset: {s:?}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Log {
    /// Opens (creating if missing) the log in `dir` and recovers it. After a
    /// clean shutdown the segments' batch headers are walked; otherwise the
    /// active segment is also CRC-checked batch by batch. Earlier segments
    /// were fsynced when they were rolled, so only the active one can hold a
    /// torn write. The first invalid batch ends the log: the file is cut
    /// there and any later segments are removed, as Kafka's recovery does.
    pub fn open(dir: PathBuf, config: LogConfig, now_ms: i64) -> Result<Log, LogError> {
        fs::create_dir_all(&dir)?;
        let mut bases = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(TMP_SUFFIX) || name.ends_with(CLEANED_SUFFIX) {
                // Leftovers of an interrupted atomic write or cleaning: the
                // file they were to replace is still intact.
                fs::remove_file(entry.path())?;
            } else if let Some(base) = parse_segment_base(name) {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();

        let mut segments: Vec<Segment> = Vec::with_capacity(bases.len());
        let mut next_offset = 0i64;
        for (i, &base) in bases.iter().enumerate() {
            let is_last = i + 1 == bases.len();
            let path = segment::log_path(&dir, base);
            if base < next_offset {
                // A segment starting inside its predecessor: the log is not
                // something this code wrote. Refuse rather than guess.
                return Err(corrupt(format!(
                    "{}: base offset {base} below the previous segment's end {next_offset}",
                    path.display()
                ))
                .into());
            }
            let (seg, outcome) = Segment::load(
                path.clone(),
                base,
                next_offset,
                !clean && is_last,
                config.index_interval_bytes,
                now_ms,
            )?;
            if outcome.truncated_bytes > 0 && !is_last {
                tracing::warn!(
                    dir = %dir.display(),
                    base_offset = base,
                    "corrupt batch in a closed segment; removing the segments after it"
                );
                for &later in &bases[i + 1..] {
                    fs::remove_file(segment::log_path(&dir, later))?;
                }
                // The cut segment is the log's tail now, and a closed
                // segment is loaded without its CRCs checked: check every
                // batch before the cut too, as for an unclean tail, so one
                // recovery leaves what the next one would.
                drop(seg);
                let (seg, _) = Segment::load(
                    path,
                    base,
                    next_offset,
                    true,
                    config.index_interval_bytes,
                    now_ms,
                )?;
                segments.push(seg);
                break;
            }
            next_offset = seg.next_offset();
            segments.push(seg);
            if outcome.truncated_bytes > 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    base_offset = base,
                    truncated_bytes = outcome.truncated_bytes,
                    "truncated a torn or corrupt log tail"
                );
            }
        }

        let persisted_start = read_log_start_offset(&dir)?;
        if segments.is_empty() {
            segments.push(Segment::create(&dir, persisted_start.unwrap_or(0), now_ms)?);
            sync_dir(&dir)?;
        }
        let first_base = segments[0].base_offset;
        let log_start_offset = persisted_start.unwrap_or(first_base).max(first_base);
        // FNV-1a of the directory: partitions draw their segment jitter apart.
        let jitter_seed = dir
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
        let mut log = Log {
            dir,
            jitter_seed,
            config,
            segments,
            log_start_offset,
            unflushed_messages: 0,
            last_flush_ms: now_ms,
            cleaned_up_to: log_start_offset,
            next_tombstone_expiry_ms: None,
            generation: 0,
            dir_failure: LogDirFailureChannel::new(),
        };
        if log.log_start_offset > log.log_end_offset().0 {
            // Data at and above the persisted log start was lost (a torn
            // tail); offsets below it were handed out already, so continue
            // from it rather than reuse them.
            log.truncate_fully_and_start_at(log.log_start_offset, now_ms)?;
        }
        if clean {
            // From now on a crash must be treated as unclean.
            fs::remove_file(&marker)?;
            sync_dir(&log.dir)?;
        }
        Ok(log)
    }

    pub fn log_start_offset(&self) -> Offset {
        Offset(self.log_start_offset)
    }
    pub fn log_end_offset(&self) -> Offset {
        Offset(self.active().next_offset())
    }
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes()).sum()
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    /// Makes this log one of a directory's: an I/O error here takes every
    /// log sharing `channel` offline, and theirs this one.
    pub fn set_dir_failure_channel(&mut self, channel: LogDirFailureChannel) {
        self.dir_failure = channel;
    }

    /// Whether the log's directory went offline after an I/O error.
    pub fn is_offline(&self) -> bool {
        self.dir_failure.is_offline()
    }

    /// Takes the directory offline for an I/O error met outside the log
    /// (the partition's own files in the same directory).
    pub fn report_failure(&self, error: &dyn std::fmt::Display) {
        self.dir_failure.fail(&self.dir, error);
    }

    fn check_online(&self) -> Result<(), LogError> {
        if self.dir_failure.is_offline() {
            return Err(LogError::LogDirOffline {
                dir: self.dir.clone(),
            });
        }
        Ok(())
    }

    /// Every I/O error takes the directory offline (Kafka's
    /// `maybeHandleIOException`): after a failed write or fsync the files
    /// can no longer be trusted to hold what the log believes they hold.
    fn failed(&self, e: LogError) -> LogError {
        if let LogError::Io(io) = &e {
            self.dir_failure.fail(&self.dir, io);
        }
        e
    }

    fn guard<T>(&self, result: Result<T, LogError>) -> Result<T, LogError> {
        result.map_err(|e| self.failed(e))
    }
    /// Base offsets of the segments, oldest first (for tests and metrics).
    pub fn segment_base_offsets(&self) -> Vec<Offset> {
        self.segments
            .iter()
            .map(|s| Offset(s.base_offset))
            .collect()
    }

    /// (leader epoch, base offset) of every batch that starts a new epoch
    /// in log order, from the headers walked on open and on append; batches
    /// without an epoch (-1) included, for the caller to skip. The first
    /// segment may start below the log start offset.
    pub fn epoch_starts(&self) -> Vec<(LeaderEpoch, Offset)> {
        let mut out: Vec<(LeaderEpoch, Offset)> = Vec::new();
        for seg in &self.segments {
            for &(epoch, offset) in seg.epoch_starts() {
                if out.last().is_none_or(|(e, _)| e.0 != epoch) {
                    out.push((LeaderEpoch(epoch), Offset(offset)));
                }
            }
        }
        out
    }

    fn active(&self) -> &Segment {
        self.segments.last().expect("a log always has a segment")
    }
    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a log always has a segment")
    }

    fn out_of_range(&self, requested: i64) -> LogError {
        LogError::OffsetOutOfRange {
            requested: Offset(requested),
            log_start: self.log_start_offset(),
            log_end: self.log_end_offset(),
        }
    }

    /// Appends one batch whose offsets the caller assigned, starting at the
    /// log end offset. The batch is written with a single `write_all`.
    pub fn append(&mut self, batch: &[u8], now_ms: i64) -> Result<(), LogError> {
        self.append_inner(batch, now_ms, false)
    }

    /// Appends one batch a leader already stored (replication): its base
    /// offset may lie above the log end offset, because a compacted
    /// leader's log has gaps, but never below it; `max.message.bytes` does
    /// not apply.
    pub fn append_replicated(&mut self, batch: &[u8], now_ms: i64) -> Result<(), LogError> {
        self.append_inner(batch, now_ms, true)
    }

    fn append_inner(
        &mut self,
        batch: &[u8],
        now_ms: i64,
        replicated: bool,
    ) -> Result<(), LogError> {
        self.check_online()?;
        let result = self.append_unchecked(batch, now_ms, replicated);
        self.guard(result)
    }

    fn append_unchecked(
        &mut self,
        batch: &[u8],
        now_ms: i64,
        replicated: bool,
    ) -> Result<(), LogError> {
        let view = RecordBatchView::parse(batch)?;
        // `max.message.bytes` limits what clients may append. A replicated
        // batch was accepted by the leader, possibly under an older, larger
        // limit: refusing it would stop replication for good (Kafka's
        // `appendAsFollower` passes `ignoreRecordSize`).
        if !replicated && batch.len() > self.config.max_message_bytes as usize {
            return Err(LogError::RecordBatchTooLarge {
                size_bytes: batch.len(),
                max_message_bytes: self.config.max_message_bytes,
            });
        }
        let log_end = self.log_end_offset();
        if view.base_offset() < log_end.0 || (!replicated && view.base_offset() != log_end.0) {
            return Err(LogError::NonMonotonicOffset {
                base_offset: Offset(view.base_offset()),
                log_end,
            });
        }
        let header = BatchHeader::from_view(&view);
        if self.should_roll_for(&header, now_ms) {
            self.roll(now_ms)?;
        }
        let interval = self.config.index_interval_bytes;
        self.active_mut().append(batch, interval)?;
        self.unflushed_messages = self
            .unflushed_messages
            .saturating_add(header.record_count.max(0) as u64);
        if self.unflushed_messages >= self.config.flush_messages {
            self.flush()?;
            self.last_flush_ms = now_ms;
        } else {
            self.maybe_flush_by_time(now_ms)?;
        }
        Ok(())
    }

    /// Kafka's `LogSegment.shouldRoll`: the batch would overflow
    /// `segment.bytes`, or `segment.ms` passed since the segment's first
    /// batch (by record timestamps, or by wall clock when they are missing).
    fn should_roll_for(&self, header: &BatchHeader, now_ms: i64) -> bool {
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        let full = active.size_bytes() + header.size_bytes > self.config.segment_bytes;
        let waited_ms = match active.first_batch_max_timestamp() {
            Some(ts) if ts >= 0 => header.max_timestamp.saturating_sub(ts),
            _ => now_ms.saturating_sub(active.created_ms),
        };
        full || waited_ms > self.roll_after_ms()
    }

    /// How long the active segment may wait before it rolls: Kafka's
    /// `maxSegmentMs` (`segment.ms`, or `max.compaction.lag.ms` when that is
    /// shorter on a compacted log) less the segment's jitter, a fixed draw
    /// in `[0, min(segment.jitter.ms, segment.ms))` per segment.
    fn roll_after_ms(&self) -> i64 {
        let c = &self.config;
        let mut ms = c.segment_ms;
        if c.cleanup_policy.compact && c.max_compaction_lag_ms > 0 {
            ms = ms.min(c.max_compaction_lag_ms);
        }
        let bound = c.segment_jitter_ms.min(c.segment_ms);
        if bound <= 0 {
            return ms;
        }
        // A draw per segment that stays the same across calls and restarts:
        // SplitMix64 of the base offset and the directory's seed.
        let mut z = (self.active().base_offset as u64) ^ self.jitter_seed;
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ms - (z % bound as u64) as i64
    }

    /// Starts a new active segment at the log end offset. The old one is
    /// fsynced first, which is what lets recovery CRC-check only the active
    /// segment.
    fn roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        let next = self.active().next_offset();
        self.active().sync()?;
        let seg = Segment::create(&self.dir, next, now_ms)?;
        sync_dir(&self.dir)?;
        self.segments.push(seg);
        Ok(())
    }

    fn maybe_flush_by_time(&mut self, now_ms: i64) -> Result<bool, LogError> {
        if self.unflushed_messages > 0
            && now_ms.saturating_sub(self.last_flush_ms) >= self.config.flush_ms
        {
            self.flush()?;
            self.last_flush_ms = now_ms;
            return Ok(true);
        }
        Ok(false)
    }

    /// Index of the segment whose range holds `offset` (the last one with
    /// base offset <= `offset`), or 0.
    fn segment_index_for(&self, offset: i64) -> usize {
        self.segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1)
    }

    /// (segment index, position, header) of the first batch whose last
    /// offset is >= `offset`, looking forward across segments (compaction
    /// may leave gaps and empty segments).
    fn locate(&self, offset: i64) -> Result<Option<(usize, u64, BatchHeader)>, LogError> {
        let mut i = self.segment_index_for(offset);
        while i < self.segments.len() {
            if let Some((pos, h)) = self.segments[i].find_batch(offset)? {
                return Ok(Some((i, pos, h)));
            }
            i += 1;
        }
        Ok(None)
    }

    /// Whole batches from the one containing `offset`, up to `max_bytes`
    /// (at least one batch if `min_one_batch`), stopping before any batch
    /// whose base offset is >= `max_offset`.
    pub fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        max_offset: Offset,
        min_one_batch: bool,
    ) -> Result<Bytes, LogError> {
        let regions = self.read_regions(offset, max_bytes, max_offset, min_one_batch)?;
        let mut out = Vec::with_capacity(regions.iter().map(|r| r.len() as usize).sum());
        for region in &regions {
            self.guard(region.read_into(&mut out).map_err(LogError::from))?;
        }
        Ok(Bytes::from(out))
    }

    /// What [`Log::read`] returns, as file regions (one per segment touched)
    /// whose bytes are read later, outside whatever lock guards the log.
    /// Only batch headers are read here.
    pub fn read_regions(
        &self,
        offset: Offset,
        max_bytes: usize,
        max_offset: Offset,
        min_one_batch: bool,
    ) -> Result<Vec<FileRegion>, LogError> {
        Ok(self
            .read_regions_to(offset, max_bytes, max_offset, min_one_batch)?
            .0)
    }

    /// [`Log::read_regions`], and the offset after the last batch taken
    /// (`offset` when none is): read_committed fetches name the aborted
    /// transactions up to it.
    pub fn read_regions_to(
        &self,
        offset: Offset,
        max_bytes: usize,
        max_offset: Offset,
        min_one_batch: bool,
    ) -> Result<(Vec<FileRegion>, Offset), LogError> {
        self.check_online()?;
        self.guard(self.read_regions_unchecked(offset, max_bytes, max_offset, min_one_batch))
    }

    fn read_regions_unchecked(
        &self,
        offset: Offset,
        max_bytes: usize,
        max_offset: Offset,
        min_one_batch: bool,
    ) -> Result<(Vec<FileRegion>, Offset), LogError> {
        let log_end = self.log_end_offset().0;
        if offset.0 < self.log_start_offset || offset.0 > log_end {
            return Err(self.out_of_range(offset.0));
        }
        let Some((mut seg_idx, mut position, _)) = self.locate(offset.0)? else {
            return Ok((Vec::new(), offset));
        };
        let mut out: Vec<FileRegion> = Vec::new();
        let mut taken = 0u64;
        let mut next = offset;
        'segments: while seg_idx < self.segments.len() {
            let seg = &self.segments[seg_idx];
            // Batches are contiguous within a segment: one region per run.
            let start = position;
            let mut end = position;
            while let Some(h) = seg.header_at(end)? {
                let budget_ok = (taken + (end - start) + h.size_bytes) <= max_bytes as u64
                    || (min_one_batch && taken == 0 && end == start);
                if h.base_offset >= max_offset.0 || !budget_ok {
                    if end > start {
                        out.push(seg.region(start, end - start)?);
                    }
                    break 'segments;
                }
                end += h.size_bytes;
                next = Offset(h.base_offset + i64::from(h.last_offset_delta) + 1);
            }
            if end > start {
                out.push(seg.region(start, end - start)?);
                taken += end - start;
            }
            seg_idx += 1;
            position = 0;
        }
        Ok((out, next))
    }

    /// Every batch from the one containing `offset` (or the first batch at
    /// or after it) to the log end, one `Bytes` per batch.
    pub fn batches_from(
        &self,
        offset: Offset,
    ) -> impl Iterator<Item = Result<Bytes, LogError>> + '_ {
        let start = match self.check_online() {
            Err(e) => Err(e),
            Ok(()) => match self.locate(offset.0.max(self.log_start_offset)) {
                Ok(found) => Ok(found.map(|(i, pos, _)| (i, pos))),
                Err(e) => Err(e),
            },
        };
        BatchesFrom {
            log: self,
            cursor: start,
        }
        .map(|item| self.guard(item))
    }

    /// Kafka's ListOffsets by timestamp: the earliest record at or above the
    /// log start offset whose timestamp is >= `timestamp_ms`, with that
    /// timestamp. Segment max timestamps, the time index and batch headers
    /// find the batch; only the records of batches whose max timestamp
    /// reaches the target are streamed.
    pub fn offset_for_timestamp(
        &self,
        timestamp_ms: i64,
    ) -> Result<Option<(Offset, i64)>, LogError> {
        self.check_online()?;
        self.guard(self.offset_for_timestamp_unchecked(timestamp_ms))
    }

    fn offset_for_timestamp_unchecked(
        &self,
        timestamp_ms: i64,
    ) -> Result<Option<(Offset, i64)>, LogError> {
        let Some(first) = self
            .segments
            .iter()
            .position(|s| s.max_timestamp() >= timestamp_ms)
        else {
            return Ok(None);
        };
        let mut seg_idx = first;
        let mut position = self.segments[first].start_position_for_timestamp(timestamp_ms);
        while seg_idx < self.segments.len() {
            let seg = &self.segments[seg_idx];
            while let Some(h) = seg.header_at(position)? {
                if h.max_timestamp >= timestamp_ms && h.last_offset() >= self.log_start_offset {
                    let bytes = seg.read_at(position, h.size_bytes)?;
                    let log_start = self.log_start_offset;
                    let found = Self::find_record(&bytes, |offset, ts| {
                        ts >= timestamp_ms && offset >= log_start
                    })?;
                    if let Some((offset, ts)) = found {
                        return Ok(Some((Offset(offset), ts)));
                    }
                }
                position += h.size_bytes;
            }
            seg_idx += 1;
            position = 0;
        }
        Ok(None)
    }

    /// The first record of `batch` for which `wanted(offset, timestamp)`
    /// holds, read by streaming (see [`records::find_record`]).
    fn find_record(
        batch: &[u8],
        wanted: impl FnMut(i64, i64) -> bool,
    ) -> Result<Option<(i64, i64)>, LogError> {
        let view = RecordBatchView::parse(batch)?;
        let corrupt = |reason: String| LogError::CorruptBatch {
            base_offset: Offset(view.base_offset()),
            reason,
        };
        let found = records::find_record(&view, wanted).map_err(corrupt)?;
        // A batch in a closed segment was not CRC-checked on open: a record
        // whose offset delta leaves its batch is damage, not an answer.
        match found {
            Some((offset, _)) if offset < view.base_offset() || offset > view.last_offset() => {
                Err(corrupt(format!(
                    "record offset {offset} outside its batch ({}..={})",
                    view.base_offset(),
                    view.last_offset()
                )))
            }
            found => Ok(found),
        }
    }

    /// For ListOffsets MAX_TIMESTAMP: the largest record timestamp in the
    /// log and the offset of the first record carrying it; `(-1, -1)` for a
    /// log without records. Batch max timestamps locate the batch; only its
    /// records are then streamed to find the record.
    pub fn max_timestamp(&self) -> Result<(i64, Offset), LogError> {
        self.check_online()?;
        self.guard(self.max_timestamp_unchecked())
    }

    fn max_timestamp_unchecked(&self) -> Result<(i64, Offset), LogError> {
        let mut best: Option<&Segment> = None;
        for seg in &self.segments {
            if seg.max_timestamp() >= 0
                && best.is_none_or(|b| seg.max_timestamp() > b.max_timestamp())
            {
                best = Some(seg);
            }
        }
        let Some(seg) = best else {
            return Ok((-1, Offset(-1)));
        };
        let position = seg.max_timestamp_position();
        let Some(h) = seg.header_at(position)? else {
            return Ok((-1, Offset(-1)));
        };
        let bytes = seg.read_at(position, h.size_bytes)?;
        let found = Self::find_record(&bytes, |_, ts| ts == h.max_timestamp)?;
        // An emptied batch kept by the cleaner has no records; its header
        // still names the timestamp, so report its last offset.
        let (offset, ts) = found.unwrap_or((h.last_offset(), h.max_timestamp));
        Ok((ts, Offset(offset)))
    }

    /// Removes every batch at or above `offset`. A batch straddling
    /// `offset` goes entirely, so the log end offset may end up below
    /// `offset`; below the log start the log is emptied and restarted at
    /// `offset`, as Kafka's `truncateFullyAndStartAt`.
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        self.check_online()?;
        let result = self.truncate_to_unchecked(offset);
        self.guard(result)
    }

    fn truncate_to_unchecked(&mut self, offset: Offset) -> Result<(), LogError> {
        let offset = offset.0;
        // Truncation takes no clock; a segment it recreates counts its age
        // from the active segment's.
        let now_ms = self.active().created_ms;
        if offset >= self.log_end_offset().0 {
            return Ok(());
        }
        self.generation += 1;
        if offset < self.log_start_offset {
            return self.truncate_fully_and_start_at(offset, now_ms);
        }
        while self.segments.len() > 1 && self.active().base_offset >= offset {
            let seg = self.segments.pop().expect("checked length");
            seg.delete()?;
        }
        let interval = self.config.index_interval_bytes;
        if let Some((pos, _)) = self.active().find_batch(offset)? {
            let seg = self.segments.pop().expect("a log always has a segment");
            self.segments.push(seg.truncate_at(pos, interval, now_ms)?);
        }
        sync_dir(&self.dir)?;
        if self.log_end_offset().0 < self.log_start_offset {
            let start = self.log_start_offset;
            self.truncate_fully_and_start_at(start, now_ms)?;
        }
        self.cleaned_up_to = self.cleaned_up_to.min(self.log_end_offset().0);
        Ok(())
    }

    /// Kafka's `truncateFullyAndStartAt`: deletes every segment and starts
    /// an empty log at `offset` (a follower whose log the leader's log start
    /// has passed).
    pub fn truncate_fully_and_start_at_offset(&mut self, offset: Offset) -> Result<(), LogError> {
        self.check_online()?;
        let result = self.truncate_fully_and_start_at_offset_unchecked(offset);
        self.guard(result)
    }

    fn truncate_fully_and_start_at_offset_unchecked(
        &mut self,
        offset: Offset,
    ) -> Result<(), LogError> {
        let now_ms = self.active().created_ms;
        self.truncate_fully_and_start_at(offset.0, now_ms)
    }

    fn truncate_fully_and_start_at(&mut self, offset: i64, now_ms: i64) -> Result<(), LogError> {
        self.generation += 1;
        for seg in self.segments.drain(..) {
            seg.delete()?;
        }
        self.segments
            .push(Segment::create(&self.dir, offset, now_ms)?);
        sync_dir(&self.dir)?;
        self.set_log_start_offset(offset)?;
        self.cleaned_up_to = offset;
        Ok(())
    }

    fn set_log_start_offset(&mut self, offset: i64) -> Result<(), LogError> {
        if offset != self.log_start_offset || !self.dir.join(LOG_START_OFFSET_FILE).exists() {
            write_atomically(
                &self.dir,
                LOG_START_OFFSET_FILE,
                format!("{offset}\n").as_bytes(),
            )?;
        }
        self.log_start_offset = offset;
        Ok(())
    }

    /// DeleteRecords: moves the log start offset up to `offset` (persisted
    /// before returning) and deletes the segments wholly below it. Returns
    /// the new log start offset.
    pub fn delete_records_before(&mut self, offset: Offset) -> Result<Offset, LogError> {
        self.check_online()?;
        let result = self.delete_records_before_unchecked(offset);
        self.guard(result)
    }

    fn delete_records_before_unchecked(&mut self, offset: Offset) -> Result<Offset, LogError> {
        if offset.0 > self.log_end_offset().0 || offset.0 < 0 {
            return Err(self.out_of_range(offset.0));
        }
        if offset.0 > self.log_start_offset {
            self.set_log_start_offset(offset.0)?;
        }
        self.delete_segments_below_log_start()?;
        Ok(self.log_start_offset())
    }

    /// Kafka's `deleteLogStartOffsetBreachedSegments`: a segment goes when
    /// the next one starts at or below the log start offset.
    fn delete_segments_below_log_start(&mut self) -> Result<(usize, u64), LogError> {
        let mut n = 0;
        while n + 1 < self.segments.len()
            && self.segments[n + 1].base_offset <= self.log_start_offset
        {
            n += 1;
        }
        self.delete_oldest_segments(n)
    }

    /// Deletes the `n` oldest segments (never all of them: a log always has
    /// an active segment) and raises the log
    /// start offset to the first remaining segment.
    fn delete_oldest_segments(&mut self, n: usize) -> Result<(usize, u64), LogError> {
        if n == 0 {
            return Ok((0, 0));
        }
        assert!(
            n < self.segments.len(),
            "callers roll before deleting the active segment"
        );
        self.generation += 1;
        let mut bytes = 0;
        let removed: Vec<Segment> = self.segments.drain(..n).collect();
        let first_base = self.segments[0].base_offset;
        if first_base > self.log_start_offset {
            // Persist the new start before the data below it disappears, so
            // a crash in between cannot expose a log start below the data.
            self.set_log_start_offset(first_base)?;
        }
        for seg in removed {
            bytes += seg.size_bytes();
            seg.delete()?;
        }
        sync_dir(&self.dir)?;
        self.cleaned_up_to = self.cleaned_up_to.max(self.log_start_offset);
        Ok((n, bytes))
    }

    /// Periodic housekeeping, as Kafka's LogManager tasks: roll an old
    /// active segment, delete segments by log start offset, retention.bytes
    /// and retention.ms, compact, and flush by flush.ms. Deletion and
    /// compaction never touch data at or above `high_watermark`, which
    /// replication may still truncate.
    pub fn maintain(
        &mut self,
        now_ms: i64,
        high_watermark: Offset,
    ) -> Result<MaintenanceReport, LogError> {
        self.check_online()?;
        let result = self.maintain_unchecked(now_ms, high_watermark, true);
        self.guard(result)
    }

    /// [`Log::maintain`] without the compaction, for a caller that runs
    /// compaction off the log's lock ([`Log::compaction_plan`], then
    /// [`CompactionJob::run`] and [`Log::install`]).
    pub fn maintain_without_compaction(
        &mut self,
        now_ms: i64,
        high_watermark: Offset,
    ) -> Result<MaintenanceReport, LogError> {
        self.check_online()?;
        let result = self.maintain_unchecked(now_ms, high_watermark, false);
        self.guard(result)
    }

    fn maintain_unchecked(
        &mut self,
        now_ms: i64,
        high_watermark: Offset,
        compact: bool,
    ) -> Result<MaintenanceReport, LogError> {
        let mut report = MaintenanceReport::default();
        let active = self.active();
        if !active.is_empty() && now_ms.saturating_sub(active.created_ms) > self.roll_after_ms() {
            self.roll(now_ms)?;
            report.rolled = true;
        }
        let (n, bytes) = self.delete_segments_below_log_start()?;
        report.segments_deleted += n;
        report.bytes_deleted += bytes;
        if self.config.cleanup_policy.delete {
            let (n, bytes) = self.delete_by_retention(now_ms, high_watermark.0)?;
            report.segments_deleted += n;
            report.bytes_deleted += bytes;
        }
        if compact
            && self.config.cleanup_policy.compact
            && self.needs_compaction(now_ms, high_watermark.0)
        {
            self.compact(now_ms, high_watermark)?;
            report.compacted = true;
        }
        report.flushed = self.maybe_flush_by_time(now_ms)?;
        report.log_start_offset = self.log_start_offset();
        Ok(report)
    }

    /// Kafka's `deleteRetentionSizeBreachedSegments` and
    /// `deleteRetentionMsBreachedSegments`: the oldest segments go while they
    /// breach a limit, including the active one (after a roll) when it is
    /// old enough and wholly below the high watermark.
    fn delete_by_retention(
        &mut self,
        now_ms: i64,
        high_watermark: i64,
    ) -> Result<(usize, u64), LogError> {
        let mut size_excess = if self.config.retention_bytes >= 0 {
            self.size_bytes() as i64 - self.config.retention_bytes
        } else {
            -1
        };
        let log_end = self.log_end_offset().0;
        let mut n = 0;
        for (i, seg) in self.segments.iter().enumerate() {
            let upper = self
                .segments
                .get(i + 1)
                .map(|s| s.base_offset)
                .unwrap_or(log_end);
            let is_last = i + 1 == self.segments.len();
            if (is_last && seg.is_empty()) || high_watermark < upper {
                break;
            }
            let by_size = size_excess >= seg.size_bytes() as i64;
            // Kafka falls back to the file's mtime for segments without
            // timestamps; the time this process created or opened the
            // segment is the conservative equivalent.
            let largest_timestamp = if seg.max_timestamp() >= 0 {
                seg.max_timestamp()
            } else {
                seg.created_ms
            };
            let by_time = self.config.retention_ms >= 0
                && now_ms.saturating_sub(largest_timestamp) > self.config.retention_ms;
            if !(by_size || by_time) {
                break;
            }
            if by_size {
                size_excess -= seg.size_bytes() as i64;
            }
            n += 1;
        }
        if n == self.segments.len() {
            self.roll(now_ms)?;
        }
        self.delete_oldest_segments(n)
    }

    pub fn flush(&mut self) -> Result<(), LogError> {
        self.check_online()?;
        let result = self.flush_unchecked();
        self.guard(result)
    }

    fn flush_unchecked(&mut self) -> Result<(), LogError> {
        self.active().sync()?;
        self.unflushed_messages = 0;
        Ok(())
    }

    /// Flushes and leaves the clean-shutdown marker, so the next open
    /// skips CRC checks.
    pub fn close(mut self) -> Result<(), LogError> {
        // flush() refuses once the directory is offline: no marker then, so
        // the next start runs recovery.
        self.flush()?;
        let result = write_atomically(&self.dir, CLEAN_SHUTDOWN_FILE, b"").map_err(LogError::from);
        self.guard(result)
    }

    /// Deletes the partition directory and everything in it (see
    /// [`delete_dir`]).
    pub fn delete(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        drop(self);
        delete_dir(&dir)?;
        Ok(())
    }
}

struct BatchesFrom<'a> {
    log: &'a Log,
    cursor: Result<Option<(usize, u64)>, LogError>,
}

impl Iterator for BatchesFrom<'_> {
    type Item = Result<Bytes, LogError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (mut seg_idx, mut position) = match std::mem::replace(&mut self.cursor, Ok(None)) {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        while seg_idx < self.log.segments.len() {
            let seg = &self.log.segments[seg_idx];
            match seg.header_at(position) {
                Ok(Some(h)) => {
                    let item = seg.read_at(position, h.size_bytes).map(Bytes::from);
                    if item.is_ok() {
                        self.cursor = Ok(Some((seg_idx, position + h.size_bytes)));
                    }
                    return Some(item.map_err(LogError::from));
                }
                Ok(None) => {
                    seg_idx += 1;
                    position = 0;
                }
                Err(e) => return Some(Err(e.into())),
            }
        }
        None
    }
}
