//! A partition's checkpoint files: the producer-state snapshot and the
//! high-watermark checkpoint, written without holding the partition's lock.
//!
//! What goes into them is captured under the lock
//! (`Partition::capture_checkpoints`), and the files are written and fsynced
//! after it is released, so the partition's produce, fetch and replication
//! requests never wait for the disk's fsync. Each capture takes the next
//! sequence number under the lock; the writer drops a capture older than the
//! last one it wrote, so whichever thread reaches the disk first, an older
//! state never replaces a newer one (a follower's truncation rewrites the
//! snapshot while a maintenance pass may still be writing the one it took
//! before).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::PartitionError;
use crate::log::LogDirFailureChannel;
use crate::types::Offset;

use super::producer_state::{ProducerSnapshot, SNAPSHOT_FILE};

/// The file holding a partition's last checkpointed high watermark.
pub const HW_CHECKPOINT_FILE: &str = "high-watermark.checkpoint";

pub fn read_high_watermark_checkpoint(dir: &Path) -> Option<Offset> {
    let text = std::fs::read_to_string(dir.join(HW_CHECKPOINT_FILE)).ok()?;
    text.trim().parse().ok().map(Offset)
}

/// The one writer of a partition's checkpoint files; shared by the
/// partition and the captures it hands out.
#[derive(Debug)]
pub struct CheckpointWriter {
    dir: PathBuf,
    /// The sequence number of the last capture written (or removal made).
    last_written: u64,
    /// The partition's files are being deleted: nothing more is written.
    retired: bool,
    /// The log directory's health: a failed checkpoint write takes it
    /// offline like any other failed write (Kafka's snapshot writes go
    /// through `maybeHandleIOException` too), and nothing is written to an
    /// offline directory.
    dir_failure: LogDirFailureChannel,
}

impl CheckpointWriter {
    pub fn new(dir: PathBuf) -> Arc<Mutex<CheckpointWriter>> {
        Arc::new(Mutex::new(CheckpointWriter {
            dir,
            last_written: 0,
            retired: false,
            dir_failure: LogDirFailureChannel::new(),
        }))
    }

    fn failed(&self, e: std::io::Error) -> PartitionError {
        self.dir_failure.fail(&self.dir, &e);
        PartitionError::Storage(e.to_string())
    }

    fn check_online(&self) -> Result<(), PartitionError> {
        if self.dir_failure.is_offline() {
            return Err(PartitionError::Storage(format!(
                "the log directory of {} is offline",
                self.dir.display()
            )));
        }
        Ok(())
    }
}

/// Reports this writer's failures to `channel` (the replica manager's).
pub fn set_dir_failure_channel(writer: &Mutex<CheckpointWriter>, channel: LogDirFailureChannel) {
    writer.lock().expect("poisoned").dir_failure = channel;
}

/// What a partition's checkpoint files should say, captured under its lock.
#[must_use = "a capture is written by `write`"]
pub struct Checkpoints {
    pub(super) seq: u64,
    pub(super) high_watermark: Offset,
    pub(super) snapshot: ProducerSnapshot,
    pub(super) writer: Arc<Mutex<CheckpointWriter>>,
}

impl Checkpoints {
    /// Writes both files atomically (temporary file, fsync, rename), unless
    /// a newer capture was written already or the partition was deleted.
    /// Returns whether it wrote. Disk work: call it without the partition's
    /// lock, off the async workers.
    pub fn write(self) -> Result<bool, PartitionError> {
        // Serialized before taking the writer, so a large producer state
        // does not hold up another capture's write.
        let snapshot = serde_json::to_vec(&self.snapshot)
            .map_err(|e| PartitionError::Storage(e.to_string()))?;
        let mut w = self.writer.lock().expect("poisoned");
        if w.retired || self.seq <= w.last_written {
            return Ok(false);
        }
        w.check_online()?;
        let write = || -> std::io::Result<()> {
            write_atomically(
                &w.dir,
                HW_CHECKPOINT_FILE,
                format!("{}\n", self.high_watermark.0).as_bytes(),
            )?;
            write_atomically(&w.dir, SNAPSHOT_FILE, &snapshot)
        };
        write().map_err(|e| w.failed(e))?;
        w.last_written = self.seq;
        Ok(true)
    }
}

/// Captures taken before `seq` are dropped rather than written from now
/// on (a truncation may have removed what they describe). Waits for a write
/// in progress to finish, so what is on disk afterwards stays.
pub fn fence(writer: &Mutex<CheckpointWriter>, seq: u64) {
    let mut w = writer.lock().expect("poisoned");
    w.last_written = w.last_written.max(seq);
}

/// Removes the producer snapshot as of capture `seq`: captures taken before
/// it are dropped rather than written after the removal.
pub fn remove_snapshot(writer: &Mutex<CheckpointWriter>, seq: u64) -> Result<(), PartitionError> {
    let mut w = writer.lock().expect("poisoned");
    w.check_online()?;
    match std::fs::remove_file(w.dir.join(SNAPSHOT_FILE)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(w.failed(e)),
    }
    w.last_written = w.last_written.max(seq);
    Ok(())
}

/// No more checkpoint writes: the partition's directory is going away.
/// Waits for a write in progress to finish.
pub fn retire(writer: &Mutex<CheckpointWriter>) {
    writer.lock().expect("poisoned").retired = true;
}

fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::producer_state::{read_snapshot, ProducerStateManager};

    fn capture(writer: &Arc<Mutex<CheckpointWriter>>, seq: u64, offset: i64) -> Checkpoints {
        Checkpoints {
            seq,
            high_watermark: Offset(offset),
            snapshot: ProducerSnapshot {
                offset: Offset(offset),
                state: ProducerStateManager::default(),
            },
            writer: writer.clone(),
        }
    }

    #[test]
    fn an_older_capture_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CheckpointWriter::new(dir.path().to_path_buf());
        let older = capture(&writer, 1, 10);
        let newer = capture(&writer, 2, 20);
        assert!(newer.write().unwrap());
        assert!(!older.write().unwrap(), "the older capture is dropped");
        assert_eq!(read_snapshot(dir.path()).unwrap().offset, Offset(20));
        assert_eq!(read_high_watermark_checkpoint(dir.path()), Some(Offset(20)));
    }

    #[test]
    fn a_removal_drops_the_captures_taken_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CheckpointWriter::new(dir.path().to_path_buf());
        assert!(capture(&writer, 1, 10).write().unwrap());
        let before = capture(&writer, 2, 30);
        remove_snapshot(&writer, 3).unwrap();
        assert!(!before.write().unwrap());
        assert!(read_snapshot(dir.path()).is_none());
        assert!(capture(&writer, 4, 5).write().unwrap());
        assert_eq!(read_snapshot(dir.path()).unwrap().offset, Offset(5));
    }

    #[test]
    fn a_fence_drops_the_captures_taken_before_it_and_keeps_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CheckpointWriter::new(dir.path().to_path_buf());
        assert!(capture(&writer, 1, 10).write().unwrap());
        let before = capture(&writer, 2, 30);
        fence(&writer, 3);
        assert!(!before.write().unwrap());
        assert_eq!(read_snapshot(dir.path()).unwrap().offset, Offset(10));
        assert!(capture(&writer, 4, 20).write().unwrap());
    }

    #[test]
    fn a_retired_writer_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writer = CheckpointWriter::new(dir.path().to_path_buf());
        let late = capture(&writer, 1, 10);
        retire(&writer);
        assert!(!late.write().unwrap());
        assert!(read_snapshot(dir.path()).is_none());
        assert_eq!(read_high_watermark_checkpoint(dir.path()), None);
    }
}
