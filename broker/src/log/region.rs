//! A byte range of a segment file, handed out by [`super::Log::read_regions`]
//! so the bytes themselves are read (or sent with `sendfile`) after the
//! partition's lock is released, and never copied into a response buffer.
//!
//! The region holds the segment's file open: a segment deleted by retention
//! or replaced by compaction after the region was taken stays readable (the
//! old inode lives until the last handle closes, as Kafka's `FileRecords`
//! slices rely on). Only a truncation of the same file (a follower cutting a
//! diverged tail) can shorten it under a reader; that shows as a short read,
//! an error, never as other bytes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct FileRegion {
    file: Arc<File>,
    position: u64,
    len: u64,
}

impl FileRegion {
    pub fn new(file: Arc<File>, position: u64, len: u64) -> FileRegion {
        FileRegion {
            file,
            position,
            len,
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the region starts in the file.
    pub fn position(&self) -> u64 {
        self.position
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads `buf.len()` bytes from `offset` within the region.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if offset.saturating_add(buf.len() as u64) > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "read past the end of a file region",
            ));
        }
        self.file.read_exact_at(buf, self.position + offset)
    }

    /// Appends the whole region to `out`.
    pub fn read_into(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let len = usize::try_from(self.len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        let start = out.len();
        out.resize(start + len, 0);
        self.read_exact_at(&mut out[start..], 0)
    }
}
