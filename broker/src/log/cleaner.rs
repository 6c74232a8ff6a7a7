//! Compaction for `cleanup.policy=compact`, after Kafka's `LogCleaner`.
//!
//! The cleanable range is the closed segments wholly below the high
//! watermark (a newer value that replication may still truncate must not
//! remove an older one). A pass builds a map key -> latest offset over that
//! range, then rewrites each segment keeping, per key, only the record at the
//! latest offset; tombstones go once `delete.retention.ms` has passed since
//! their timestamp. Offsets are preserved (gaps are normal), and each
//! rewritten segment replaces the old one by an atomic rename.
//!
//! Deliberate simplifications, all on the side of keeping data:
//! transactional and control batches are kept whole and do not enter the key
//! map (there is no transaction index to find aborted data); the key map is a
//! plain in-memory map of full keys; segments are not merged.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use protocol::record_batch::RecordBatchView;

use super::records::{self, BatchHeader, RawRecord};
use super::segment::{log_path, Segment};
use super::{sync_dir, Log, LogError, CLEANED_SUFFIX};
use crate::types::Offset;

fn corrupt_batch(view: &RecordBatchView<'_>, reason: String) -> LogError {
    LogError::CorruptBatch {
        base_offset: Offset(view.base_offset()),
        reason,
    }
}

/// Calls `f` with each batch of the segment, in order.
fn for_each_batch(
    seg: &Segment,
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

/// Batches whose records the cleaner may drop.
fn is_cleanable_batch(view: &RecordBatchView<'_>) -> bool {
    !view.is_control() && !view.is_transactional()
}

impl Log {
    /// Number of leading segments the cleaner may rewrite, and the offset
    /// where the uncleanable part of the log begins.
    fn cleanable_range(&self, high_watermark: i64) -> (usize, i64) {
        let mut n = 0;
        while n + 1 < self.segments.len() && self.segments[n + 1].base_offset <= high_watermark {
            n += 1;
        }
        (n, self.segments[n].base_offset)
    }

    /// Whether a pass would do anything: new data became cleanable, or a
    /// kept tombstone has expired.
    pub(super) fn needs_compaction(&self, now_ms: i64, high_watermark: i64) -> bool {
        let (n, end) = self.cleanable_range(high_watermark);
        n > 0
            && (end > self.cleaned_up_to
                || self.next_tombstone_expiry_ms.is_some_and(|t| now_ms >= t))
    }

    /// One cleaning pass over the closed segments below `high_watermark`.
    pub fn compact(&mut self, now_ms: i64, high_watermark: Offset) -> Result<(), LogError> {
        let (n, end) = self.cleanable_range(high_watermark.0);
        if n == 0 {
            return Ok(());
        }

        // The last batch of every producer keeps at least its header, so the
        // producer's epoch and sequence can be rebuilt from the log
        // (Kafka's `isBatchLastRecordOfProducer`).
        let mut producer_last_offset: HashMap<i64, i64> = HashMap::new();
        for seg in &self.segments {
            let mut position = 0;
            while let Some(h) = seg.header_at(position)? {
                if h.producer_id >= 0 {
                    producer_last_offset.insert(h.producer_id, h.last_offset());
                }
                position += h.size_bytes;
            }
        }

        let mut latest_offset_by_key: HashMap<Vec<u8>, i64> = HashMap::new();
        for seg in &self.segments[..n] {
            for_each_batch(seg, |view| {
                if !is_cleanable_batch(view) {
                    return Ok(());
                }
                let payload =
                    records::decompressed_payload(view).map_err(|e| corrupt_batch(view, e))?;
                let recs = records::parse_records(&payload, view.record_count())
                    .map_err(|e| corrupt_batch(view, e))?;
                for r in recs {
                    if let Some(key) = r.key {
                        let offset = view.base_offset() + r.offset_delta as i64;
                        latest_offset_by_key.insert(key.to_vec(), offset);
                    }
                }
                Ok(())
            })?;
        }

        let delete_retention_ms = self.config.delete_retention_ms;
        let mut next_tombstone_expiry_ms: Option<i64> = None;
        let mut cleaned: Vec<Segment> = Vec::with_capacity(n);
        let old: Vec<Segment> = self.segments.drain(..n).collect();
        let mut failure = None;
        for (i, seg) in old.into_iter().enumerate() {
            if failure.is_some() {
                cleaned.push(seg);
                continue;
            }
            let filter = |view: &RecordBatchView<'_>, r: &RawRecord<'_>| -> bool {
                let offset = view.base_offset() + r.offset_delta as i64;
                let Some(key) = r.key else {
                    // Kafka's cleaner drops keyless records: they cannot be
                    // in a compacted topic legitimately.
                    return false;
                };
                if latest_offset_by_key.get(key).is_some_and(|&l| l > offset) {
                    return false;
                }
                if r.has_value {
                    return true;
                }
                let ts = if view.is_log_append_time() {
                    view.max_timestamp()
                } else {
                    view.base_timestamp().wrapping_add(r.timestamp_delta)
                };
                let expiry = ts.saturating_add(delete_retention_ms);
                if now_ms >= expiry {
                    return false;
                }
                next_tombstone_expiry_ms =
                    Some(next_tombstone_expiry_ms.map_or(expiry, |t| t.min(expiry)));
                true
            };
            match self.write_cleaned(&seg, &producer_last_offset, filter) {
                Ok(None) => cleaned.push(seg),
                Ok(Some((path, bytes))) => {
                    // After an I/O error here the segment may be missing from
                    // the list; I/O errors are fatal, and reopening the log
                    // finds the old or the cleaned file, both complete.
                    match self.swap_in_cleaned(seg, path, bytes, i == 0, now_ms) {
                        Ok(Some(seg)) => cleaned.push(seg),
                        Ok(None) => {}
                        Err(e) => failure = Some(e),
                    }
                }
                Err(e) => {
                    cleaned.push(seg);
                    failure = Some(e);
                }
            }
        }
        // Put the cleaned segments back in front of the uncleanable ones.
        cleaned.append(&mut self.segments);
        self.segments = cleaned;
        if let Some(e) = failure {
            return Err(e);
        }
        self.cleaned_up_to = end;
        self.next_tombstone_expiry_ms = next_tombstone_expiry_ms;
        Ok(())
    }

    /// Writes the cleaned copy of `seg` to `<base>.log.cleaned`, fsynced.
    /// Returns its path and size, or `None` when cleaning changes nothing.
    fn write_cleaned(
        &self,
        seg: &Segment,
        producer_last_offset: &HashMap<i64, i64>,
        mut keep: impl FnMut(&RecordBatchView<'_>, &RawRecord<'_>) -> bool,
    ) -> Result<Option<(PathBuf, u64)>, LogError> {
        let tmp_path = self
            .dir
            .join(format!("{:020}.log{CLEANED_SUFFIX}", seg.base_offset));
        let mut changed = false;
        let mut written = 0u64;
        let result = (|| -> Result<(), LogError> {
            let mut out = BufWriter::new(fs::File::create(&tmp_path)?);
            for_each_batch(seg, |view| {
                let bytes = view.as_bytes();
                let new_bytes = if !is_cleanable_batch(view) {
                    bytes.to_vec()
                } else {
                    let payload =
                        records::decompressed_payload(view).map_err(|e| corrupt_batch(view, e))?;
                    let recs = records::parse_records(&payload, view.record_count())
                        .map_err(|e| corrupt_batch(view, e))?;
                    let retained: Vec<&RawRecord<'_>> =
                        recs.iter().filter(|r| keep(view, r)).collect();
                    if retained.len() == recs.len() {
                        bytes.to_vec()
                    } else if retained.is_empty() {
                        changed = true;
                        let h = BatchHeader::from_view(view);
                        if h.producer_id >= 0
                            && producer_last_offset.get(&h.producer_id) == Some(&h.last_offset())
                        {
                            records::empty_batch_like(view)
                        } else {
                            Vec::new()
                        }
                    } else {
                        changed = true;
                        records::rebuild_with_records(view, &retained)
                            .map_err(|e| corrupt_batch(view, e))?
                    }
                };
                out.write_all(&new_bytes)?;
                written += new_bytes.len() as u64;
                Ok(())
            })?;
            let file = out.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            Ok(())
        })();
        if result.is_err() || !changed {
            // Best effort: open() deletes `.cleaned` leftovers anyway.
            let _ = fs::remove_file(&tmp_path);
        }
        result?;
        Ok(changed.then_some((tmp_path, written)))
    }

    /// Replaces `seg` with its cleaned copy. The rename is the commit point:
    /// a crash before it leaves the old segment and a `.cleaned` file that
    /// open() deletes. Returns `None` when the segment became empty and was
    /// removed; the first segment is kept even when empty, so the log start
    /// offset does not move.
    fn swap_in_cleaned(
        &self,
        seg: Segment,
        cleaned_path: PathBuf,
        cleaned_bytes: u64,
        is_first: bool,
        now_ms: i64,
    ) -> Result<Option<Segment>, LogError> {
        let base = seg.base_offset;
        let created_ms = seg.created_ms;
        let path = log_path(&self.dir, base);
        drop(seg);
        if cleaned_bytes == 0 && !is_first {
            fs::remove_file(&path)?;
            fs::remove_file(&cleaned_path)?;
            sync_dir(&self.dir)?;
            return Ok(None);
        }
        fs::rename(&cleaned_path, &path)?;
        sync_dir(&self.dir)?;
        let (mut seg, _) = Segment::load(
            path,
            base,
            base,
            false,
            self.config.index_interval_bytes,
            now_ms,
        )?;
        seg.created_ms = created_ms;
        Ok(Some(seg))
    }
}
