//! TEMPORARY in-memory stand-in with the agreed API, so the server compiles
//! while the segment-file log is written on its own branch. Replaced on merge.
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::types::Offset;

#[derive(Clone, Debug)]
pub struct LogConfig {
    pub segment_bytes: u64,
    pub segment_ms: i64,
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub cleanup_policy: CleanupPolicy,
    pub delete_retention_ms: i64,
    pub index_interval_bytes: u32,
    pub flush_messages: u64,
    pub flush_ms: i64,
    pub max_message_bytes: u32,
}
impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1 << 30,
            segment_ms: 604_800_000,
            retention_ms: 604_800_000,
            retention_bytes: -1,
            cleanup_policy: CleanupPolicy { delete: true, compact: false },
            delete_retention_ms: 86_400_000,
            index_interval_bytes: 4096,
            flush_messages: u64::MAX,
            flush_ms: i64::MAX,
            max_message_bytes: 1_048_588,
        }
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("offset {requested} out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange { requested: Offset, log_start: Offset, log_end: Offset },
    #[error("non-monotonic offset")]
    NonMonotonicOffset { expected: Offset, got: Offset },
}
#[derive(Debug, Default)]
pub struct MaintenanceReport {}
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    batches: Vec<(i64, i64, Bytes)>,
    start: i64,
    end: i64,
}
impl Log {
    pub fn open(dir: PathBuf, config: LogConfig, _now_ms: i64) -> Result<Log, LogError> {
        std::fs::create_dir_all(&dir)?;
        Ok(Log { dir, config, batches: vec![], start: 0, end: 0 })
    }
    pub fn log_start_offset(&self) -> Offset { Offset(self.start) }
    pub fn log_end_offset(&self) -> Offset { Offset(self.end) }
    pub fn size_bytes(&self) -> u64 { self.batches.iter().map(|b| b.2.len() as u64).sum() }
    pub fn dir(&self) -> &Path { &self.dir }
    pub fn config(&self) -> &LogConfig { &self.config }
    pub fn set_config(&mut self, c: LogConfig) { self.config = c }
    pub fn append(&mut self, batch: &[u8], _now_ms: i64) -> Result<(), LogError> {
        let v = protocol::record_batch::RecordBatchView::parse(batch).expect("validated");
        if v.base_offset() != self.end {
            return Err(LogError::NonMonotonicOffset { expected: Offset(self.end), got: Offset(v.base_offset()) });
        }
        self.end = v.last_offset() + 1;
        self.batches.push((v.base_offset(), v.last_offset(), Bytes::copy_from_slice(batch)));
        Ok(())
    }
    pub fn read(&self, offset: Offset, max_bytes: usize, max_offset: Offset, min_one_batch: bool) -> Result<Bytes, LogError> {
        if offset.0 < self.start || offset.0 > self.end {
            return Err(LogError::OffsetOutOfRange { requested: offset, log_start: Offset(self.start), log_end: Offset(self.end) });
        }
        let mut out = Vec::new();
        for (b, l, bytes) in &self.batches {
            if *l < offset.0 { continue; }
            if *b >= max_offset.0 { break; }
            if out.len() + bytes.len() > max_bytes && !(out.is_empty() && min_one_batch) { break; }
            out.extend_from_slice(bytes);
        }
        Ok(Bytes::from(out))
    }
    pub fn offset_for_timestamp(&self, ts: i64) -> Result<Option<(Offset, i64)>, LogError> {
        for (b, _, bytes) in &self.batches {
            let v = protocol::record_batch::RecordBatchView::parse(bytes).expect("stored");
            if v.max_timestamp() >= ts { return Ok(Some((Offset(*b), v.max_timestamp()))); }
        }
        Ok(None)
    }
    pub fn max_timestamp(&self) -> (i64, Offset) {
        let mut best = (-1, Offset(-1));
        for (b, _, bytes) in &self.batches {
            let v = protocol::record_batch::RecordBatchView::parse(bytes).expect("stored");
            if v.max_timestamp() > best.0 { best = (v.max_timestamp(), Offset(*b)); }
        }
        best
    }
    pub fn batches_from(&self, offset: Offset) -> impl Iterator<Item = Result<Bytes, LogError>> + '_ {
        self.batches.iter().filter(move |b| b.1 >= offset.0).map(|b| Ok(b.2.clone()))
    }
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        self.batches.retain(|b| b.0 < offset.0);
        self.end = self.end.min(offset.0);
        Ok(())
    }
    pub fn delete_records_before(&mut self, offset: Offset) -> Result<Offset, LogError> {
        if offset.0 > self.end {
            return Err(LogError::OffsetOutOfRange { requested: offset, log_start: Offset(self.start), log_end: Offset(self.end) });
        }
        self.start = self.start.max(offset.0);
        self.batches.retain(|b| b.1 >= offset.0);
        Ok(Offset(self.start))
    }
    pub fn maintain(&mut self, _now_ms: i64) -> Result<MaintenanceReport, LogError> { Ok(MaintenanceReport {}) }
    pub fn flush(&mut self) -> Result<(), LogError> { Ok(()) }
    pub fn close(self) -> Result<(), LogError> { Ok(()) }
    pub fn delete(self) -> Result<(), LogError> { std::fs::remove_dir_all(&self.dir)?; Ok(()) }
}
