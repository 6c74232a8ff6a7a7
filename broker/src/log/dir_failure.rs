//! The log directory's health, after Kafka's `LogDirFailureChannel`: the
//! first I/O error in any log of the directory takes the whole directory
//! offline. From then on nothing in it is appended, read, cleaned or
//! flushed (callers get [`LogError::LogDirOffline`](super::LogError), which
//! clients see as KAFKA_STORAGE_ERROR), and whoever watches the channel
//! (the broker: `lib.rs`) moves leadership away and stops the process, as
//! Kafka does when its last log directory fails.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

/// Shared by every log of one directory; cheap to clone.
#[derive(Clone, Debug)]
pub struct LogDirFailureChannel {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    offline: AtomicBool,
    /// `Some(reason)` once the directory failed.
    failure: watch::Sender<Option<String>>,
}

impl Default for LogDirFailureChannel {
    fn default() -> Self {
        Self::new()
    }
}

impl LogDirFailureChannel {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                offline: AtomicBool::new(false),
                failure: watch::channel(None).0,
            }),
        }
    }

    /// One atomic load: the append path asks on every batch.
    pub fn is_offline(&self) -> bool {
        self.inner.offline.load(Ordering::Acquire)
    }

    /// Takes the directory offline because an operation on `path` failed
    /// with `error`. Only the first failure is logged and kept as the reason.
    pub fn fail(&self, path: &Path, error: &dyn std::fmt::Display) {
        if self.inner.offline.swap(true, Ordering::AcqRel) {
            return;
        }
        let reason = format!("{}: {error}", path.display());
        tracing::error!(%reason, "log directory failed; it is offline from now on");
        metrics::gauge!("kafka_log_offline_log_directory_count").set(1.0);
        self.inner.failure.send_replace(Some(reason));
    }

    /// Watches for the failure (`Some(reason)` once it happened).
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.inner.failure.subscribe()
    }
}
