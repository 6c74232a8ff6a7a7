//! One segment: a `<base_offset:020>.log` file of whole batches, with its
//! sparse offset and time indexes kept in memory.
//!
//! The indexes are not written to `.index`/`.timeindex` files: they are
//! rebuilt on open by walking batch headers (61 bytes per batch, not the
//! batch bodies), which is the simplest way to never trust a stale index.
//! Their shape follows Kafka's `OffsetIndex` and `TimeIndex`: one entry per
//! `index.interval.bytes` of appended data.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::record_batch::{RecordBatchView, HEADER_LEN};

use super::records::BatchHeader;
use super::region::FileRegion;

pub(crate) const LOG_SUFFIX: &str = ".log";

pub(crate) fn log_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{base_offset:020}{LOG_SUFFIX}"))
}

pub(crate) fn corrupt(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// What opening a segment found in it.
pub(crate) struct LoadOutcome {
    /// Bytes cut from the end because they were torn or corrupt.
    pub truncated_bytes: u64,
}

pub(crate) struct Segment {
    pub base_offset: i64,
    path: PathBuf,
    /// Shared with the [`FileRegion`]s fetches hold while they send.
    file: Arc<File>,
    size_bytes: u64,
    /// Last offset of the last batch plus one; `base_offset` when empty.
    next_offset: i64,
    /// (last offset of a batch, file position of that batch), ascending.
    offset_index: Vec<(i64, u64)>,
    /// (max timestamp so far, last offset of the batch that set it), both
    /// strictly ascending.
    time_index: Vec<(i64, i64)>,
    bytes_since_last_index_entry: u64,
    /// Largest batch max timestamp in the segment, -1 when empty.
    max_timestamp: i64,
    /// Position of the first batch that carries `max_timestamp`.
    max_timestamp_position: u64,
    /// Max timestamp of the first batch: what `segment.ms` counts from, as
    /// Kafka's `rollingBasedTimestamp`.
    first_batch_max_timestamp: Option<i64>,
    /// (leader epoch, base offset) of each batch whose epoch differs from
    /// the batch before it in this segment: the leader epoch cache's input.
    epoch_starts: Vec<(i32, i64)>,
    /// When this process created or opened the segment; the fallback for
    /// `segment.ms` when batches carry no timestamp.
    pub created_ms: i64,
}

impl Segment {
    pub fn create(dir: &Path, base_offset: i64, now_ms: i64) -> io::Result<Segment> {
        let path = log_path(dir, base_offset);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .open(&path)?;
        Ok(Self::empty(path, file, base_offset, now_ms))
    }

    fn empty(path: PathBuf, file: File, base_offset: i64, now_ms: i64) -> Segment {
        Segment {
            base_offset,
            path,
            file: Arc::new(file),
            size_bytes: 0,
            next_offset: base_offset,
            offset_index: Vec::new(),
            time_index: Vec::new(),
            bytes_since_last_index_entry: 0,
            max_timestamp: -1,
            max_timestamp_position: 0,
            first_batch_max_timestamp: None,
            epoch_starts: Vec::new(),
            created_ms: now_ms,
        }
    }

    /// Opens an existing segment and rebuilds its indexes. Walks batch
    /// headers; with `verify_crc` also reads each batch and checks its CRC.
    /// The first batch that is torn, corrupt, or whose base offset is below
    /// `min_next_offset` (offsets must grow) ends the valid data, and the file
    /// is truncated there.
    pub fn load(
        path: PathBuf,
        base_offset: i64,
        min_next_offset: i64,
        verify_crc: bool,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> io::Result<(Segment, LoadOutcome)> {
        let file = OpenOptions::new().read(true).append(true).open(&path)?;
        let file_len = file.metadata()?.len();
        let mut seg = Self::empty(path, file, base_offset, now_ms);
        let mut expected_min = min_next_offset.max(base_offset);
        let mut position = 0u64;
        let mut header = [0u8; HEADER_LEN];
        while position < file_len {
            let remaining = file_len - position;
            if remaining < HEADER_LEN as u64 {
                break;
            }
            seg.file.read_exact_at(&mut header, position)?;
            let Some(h) = BatchHeader::parse(&header) else {
                break;
            };
            if h.size_bytes > remaining || h.base_offset < expected_min {
                break;
            }
            if verify_crc {
                let len =
                    usize::try_from(h.size_bytes).map_err(|_| corrupt("batch too large".into()))?;
                let mut batch = vec![0u8; len];
                seg.file.read_exact_at(&mut batch, position)?;
                let ok = RecordBatchView::parse(&batch)
                    .and_then(|v| v.verify_crc())
                    .is_ok();
                if !ok {
                    break;
                }
            }
            seg.note_batch(&h, position, index_interval_bytes);
            expected_min = h.next_offset();
            position += h.size_bytes;
        }
        let truncated_bytes = file_len - position;
        if truncated_bytes > 0 {
            seg.file.set_len(position)?;
            seg.file.sync_all()?;
        }
        seg.size_bytes = position;
        Ok((seg, LoadOutcome { truncated_bytes }))
    }

    /// Index bookkeeping for a batch now stored at `position`, as Kafka's
    /// `LogSegment.append`: index entries are added once more than
    /// `index_interval_bytes` were appended since the previous entry.
    fn note_batch(&mut self, h: &BatchHeader, position: u64, index_interval_bytes: u32) {
        if h.max_timestamp > self.max_timestamp {
            self.max_timestamp = h.max_timestamp;
            self.max_timestamp_position = position;
        }
        if self
            .epoch_starts
            .last()
            .is_none_or(|&(e, _)| e != h.leader_epoch)
        {
            self.epoch_starts.push((h.leader_epoch, h.base_offset));
        }
        if self.first_batch_max_timestamp.is_none() {
            self.first_batch_max_timestamp = Some(h.max_timestamp);
        }
        if self.bytes_since_last_index_entry > index_interval_bytes as u64 {
            self.offset_index.push((h.last_offset(), position));
            let last_ts = self.time_index.last().map(|e| e.0).unwrap_or(i64::MIN);
            if self.max_timestamp > last_ts {
                self.time_index.push((self.max_timestamp, h.last_offset()));
            }
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += h.size_bytes;
        self.next_offset = h.next_offset();
        self.size_bytes = position + h.size_bytes;
    }

    /// Appends one batch with a single write. A write that fails part way
    /// (ENOSPC, EIO) is cut back off the file, so no partial batch stays
    /// where the next one would be indexed; if even that fails, the caller
    /// takes the log offline and recovery cuts the torn tail on the next
    /// start. A successful append costs the one write.
    pub fn append(&mut self, batch: &[u8], index_interval_bytes: u32) -> io::Result<()> {
        let h =
            BatchHeader::parse(batch).ok_or_else(|| corrupt("append of a bad header".into()))?;
        let position = self.size_bytes;
        if let Err(e) = self.write(batch) {
            if let Err(cut) = self.file.set_len(position) {
                tracing::error!(
                    path = %self.path.display(),
                    error = %cut,
                    "cannot cut a failed append off the segment"
                );
            }
            return Err(e);
        }
        self.note_batch(&h, position, index_interval_bytes);
        Ok(())
    }

    fn write(&self, batch: &[u8]) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some((n, e)) = super::faults::on_write(&self.path, batch.len()) {
            (&*self.file).write_all(&batch[..n])?;
            return Err(e);
        }
        (&*self.file).write_all(batch)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    pub fn max_timestamp_position(&self) -> u64 {
        self.max_timestamp_position
    }
    pub fn epoch_starts(&self) -> &[(i32, i64)] {
        &self.epoch_starts
    }
    pub fn first_batch_max_timestamp(&self) -> Option<i64> {
        self.first_batch_max_timestamp
    }

    pub fn sync(&self) -> io::Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(e) = super::faults::on_sync(&self.path) {
            return Err(e);
        }
        self.file.sync_data()
    }

    /// The header of the batch at `position`, or `None` at the end of the
    /// segment. Positions come from the segment's own walk, so a header that
    /// does not parse means the file changed under us: a fatal I/O error.
    pub fn header_at(&self, position: u64) -> io::Result<Option<BatchHeader>> {
        header_at(&self.file, &self.path, self.size_bytes, position)
    }

    pub fn read_at(&self, position: u64, len: u64) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.region(position, len)?.read_into(&mut buf)?;
        Ok(buf)
    }

    /// `len` bytes from `position`, to be read later (see [`FileRegion`]).
    pub fn region(&self, position: u64, len: u64) -> io::Result<FileRegion> {
        if position
            .checked_add(len)
            .is_none_or(|end| end > self.size_bytes)
        {
            return Err(corrupt(format!(
                "{}: read of {len} bytes at {position} past the end",
                self.path.display()
            )));
        }
        Ok(FileRegion::new(self.file.clone(), position, len))
    }

    /// A read-only view of the segment as it is now, with its own file
    /// handle, for work done without the log (compaction): appends after
    /// this call are not in it.
    pub fn reader(&self) -> io::Result<SegmentReader> {
        Ok(SegmentReader {
            base_offset: self.base_offset,
            path: self.path.clone(),
            file: self.file.try_clone()?,
            size_bytes: self.size_bytes,
            created_ms: self.created_ms,
        })
    }

    /// A position from which scanning forward reaches the batch containing
    /// `offset` (Kafka's `OffsetIndex.lookup`).
    fn index_lookup(&self, offset: i64) -> u64 {
        let idx = self
            .offset_index
            .partition_point(|&(last, _)| last <= offset);
        if idx == 0 {
            0
        } else {
            self.offset_index[idx - 1].1
        }
    }

    /// Position and header of the first batch whose last offset is >=
    /// `offset`, if the segment has one.
    pub fn find_batch(&self, offset: i64) -> io::Result<Option<(u64, BatchHeader)>> {
        if offset >= self.next_offset {
            return Ok(None);
        }
        let mut position = self.index_lookup(offset);
        while let Some(h) = self.header_at(position)? {
            if h.last_offset() >= offset {
                return Ok(Some((position, h)));
            }
            position += h.size_bytes;
        }
        Ok(None)
    }

    /// A position from which scanning forward finds the first record with
    /// timestamp >= `timestamp_ms`: after the last time index entry whose
    /// timestamp is below the target, every earlier record is below it too.
    pub fn start_position_for_timestamp(&self, timestamp_ms: i64) -> u64 {
        let idx = self
            .time_index
            .partition_point(|&(ts, _)| ts < timestamp_ms);
        if idx == 0 {
            0
        } else {
            self.index_lookup(self.time_index[idx - 1].1 + 1)
        }
    }

    /// Cuts the segment at `position` (a batch boundary) and rebuilds the
    /// in-memory state from what remains.
    pub fn truncate_at(
        self,
        position: u64,
        index_interval_bytes: u32,
        now_ms: i64,
    ) -> io::Result<Segment> {
        self.file.set_len(position)?;
        self.file.sync_all()?;
        let created_ms = self.created_ms;
        let (mut seg, _) = Segment::load(
            self.path,
            self.base_offset,
            self.base_offset,
            false,
            index_interval_bytes,
            now_ms,
        )?;
        seg.created_ms = created_ms;
        Ok(seg)
    }

    /// The segment's file moved to `path` (a cleaned copy renamed over
    /// the segment it replaces); the open handle stays valid.
    pub fn moved_to(mut self, path: PathBuf) -> Segment {
        self.path = path;
        self
    }

    pub fn delete(self) -> io::Result<()> {
        let path = self.path;
        drop(self.file);
        std::fs::remove_file(path)
    }
}

/// A segment's first `size_bytes` bytes, read through its own handle.
pub(crate) struct SegmentReader {
    pub base_offset: i64,
    pub path: PathBuf,
    file: File,
    pub size_bytes: u64,
    pub created_ms: i64,
}

impl SegmentReader {
    pub fn header_at(&self, position: u64) -> io::Result<Option<BatchHeader>> {
        header_at(&self.file, &self.path, self.size_bytes, position)
    }

    pub fn read_at(&self, position: u64, len: u64) -> io::Result<Vec<u8>> {
        read_at(&self.file, &self.path, self.size_bytes, position, len)
    }
}

fn header_at(
    file: &File,
    path: &Path,
    size: u64,
    position: u64,
) -> io::Result<Option<BatchHeader>> {
    if position >= size {
        return Ok(None);
    }
    if size - position < HEADER_LEN as u64 {
        return Err(corrupt(format!(
            "{}: partial header at {position}",
            path.display()
        )));
    }
    let mut header = [0u8; HEADER_LEN];
    file.read_exact_at(&mut header, position)?;
    match BatchHeader::parse(&header) {
        Some(h) if h.size_bytes <= size - position => Ok(Some(h)),
        _ => Err(corrupt(format!(
            "{}: invalid batch header at {position}",
            path.display()
        ))),
    }
}

fn read_at(file: &File, path: &Path, size: u64, position: u64, len: u64) -> io::Result<Vec<u8>> {
    if position.checked_add(len).is_none_or(|end| end > size) {
        return Err(corrupt(format!(
            "{}: read of {len} bytes at {position} past the end",
            path.display()
        )));
    }
    let len = usize::try_from(len).map_err(|_| corrupt("read too large".into()))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, position)?;
    Ok(buf)
}
