//! Test-only fault injection in the storage layer (cargo feature
//! `fault-injection`, on in the broker's own tests): makes chosen segment
//! writes and fsyncs fail, as a full or failing disk would, without special
//! filesystems. Faults are scoped by path prefix (a test's own data
//! directory), so tests running in parallel in one process do not see each
//! other's faults.
//!
//! Only `Segment::append` and `Segment::sync` consult it; a build without
//! the feature compiles the checks away.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The operation a fault fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// A segment append: `write_bytes` bytes of the batch reach the file,
    /// then the write fails.
    Write { write_bytes: usize },
    /// An fsync of a segment.
    Sync,
}

/// A fault: under `dir`, the matching operations after the first `after`
/// fail with `errno` (e.g. `libc` ENOSPC 28, EIO 5), every one of them until
/// [`clear`] (a full or broken disk stays so).
#[derive(Clone, Debug)]
pub struct Fault {
    pub dir: PathBuf,
    pub op: FaultOp,
    pub after: u32,
    pub errno: i32,
}

/// ENOSPC: no space left on device.
pub const ENOSPC: i32 = 28;
/// EIO: input/output error.
pub const EIO: i32 = 5;

struct Armed {
    fault: Fault,
    seen: u32,
}

static FAULTS: Mutex<Vec<Armed>> = Mutex::new(Vec::new());

/// Arms `fault`.
pub fn inject(fault: Fault) {
    FAULTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Armed { fault, seen: 0 });
}

/// Disarms every fault under `dir`.
pub fn clear(dir: &Path) {
    FAULTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|a| !a.fault.dir.starts_with(dir));
}

/// The fault an operation on `path` meets, if any.
fn check(path: &Path, is_write: bool) -> Option<(FaultOp, io::Error)> {
    let mut faults = FAULTS.lock().unwrap_or_else(|e| e.into_inner());
    for armed in faults.iter_mut() {
        let matches = path.starts_with(&armed.fault.dir)
            && matches!(
                (armed.fault.op, is_write),
                (FaultOp::Write { .. }, true) | (FaultOp::Sync, false)
            );
        if !matches {
            continue;
        }
        if armed.seen < armed.fault.after {
            armed.seen += 1;
            continue;
        }
        return Some((
            armed.fault.op,
            io::Error::from_raw_os_error(armed.fault.errno),
        ));
    }
    None
}

/// For `Segment::append`: `Some((bytes to write first, error))` when this
/// write fails.
pub(super) fn on_write(path: &Path, len: usize) -> Option<(usize, io::Error)> {
    match check(path, true)? {
        (FaultOp::Write { write_bytes }, e) => Some((write_bytes.min(len), e)),
        (FaultOp::Sync, _) => None,
    }
}

/// For `Segment::sync`: the error this fsync fails with.
pub(super) fn on_sync(path: &Path) -> Option<io::Error> {
    check(path, false).map(|(_, e)| e)
}
