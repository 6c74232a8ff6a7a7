//! RocksDB storage for the metadata Raft group: the Raft log, the vote and
//! commit index, and the state machine (the applied [`MetadataImage`]).
//!
//! One RocksDB instance holds three column families:
//! - `logs`: key = log index as 8 big-endian bytes (so key order is log order),
//!   value = JSON of the `Entry`.
//! - `log_meta`: the vote, the committed log id and the last purged log id.
//! - `sm`: last applied log id, last membership, the image, the current snapshot.
//!
//! Every write is synced before it is acknowledged. Raft's safety depends on
//! the vote and the appended entries surviving a crash; the state machine is
//! synced too because log purging trusts the stored snapshot to be on disk.
//! The metadata write rate is low (topic changes, producer id blocks), so an
//! fsync per write costs little.
//!
//! RocksDB calls are synchronous and run on the async task that calls them; at
//! this write rate a short block of a runtime thread is cheaper than moving the
//! handle into `spawn_blocking` for each call.

// openraft's storage traits fix `StorageError` (over 200 bytes) as the error
// type; the helpers here return it too so `?` works without conversions.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader,
    RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};

use super::image::{MetadataError, MetadataImage, MetadataOutcome};
use super::TypeConfig;

/// Openraft's node id for this group (the broker's `node.id`, widened).
pub type RaftNodeId = u64;

type StorageResult<T> = Result<T, StorageError<RaftNodeId>>;

const CF_LOGS: &str = "logs";
const CF_LOG_META: &str = "log_meta";
const CF_SM: &str = "sm";

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";
const KEY_LAST_APPLIED: &[u8] = b"last_applied";
const KEY_LAST_MEMBERSHIP: &[u8] = b"last_membership";
const KEY_IMAGE: &[u8] = b"image";
const KEY_SNAPSHOT: &[u8] = b"snapshot";

/// The RocksDB instance, plus a signal that fires once it is closed.
///
/// Openraft's background tasks own the storage and drop it on their own
/// schedule after `Raft::shutdown`; whoever wants to reopen the directory
/// waits for the signal, because RocksDB holds a lock on it while open.
pub struct MetadataDb {
    // Fields drop in declaration order: the database closes (releasing its
    // lock) before the sender drops and wakes the receiver.
    db: DB,
    _closed_tx: oneshot::Sender<()>,
}

impl std::ops::Deref for MetadataDb {
    type Target = DB;

    fn deref(&self) -> &DB {
        &self.db
    }
}

/// Opens (creating if missing) the RocksDB instance that holds the metadata
/// log and state machine. The receiver completes (with an error, as nothing is
/// ever sent) once the last reference to the database is gone and it is closed.
pub fn open_db(dir: &Path) -> Result<(Arc<MetadataDb>, oneshot::Receiver<()>), rocksdb::Error> {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    let families = [CF_LOGS, CF_LOG_META, CF_SM]
        .into_iter()
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db = DB::open_cf_descriptors(&options, dir, families)?;
    let (closed_tx, closed_rx) = oneshot::channel();
    let db = MetadataDb {
        db,
        _closed_tx: closed_tx,
    };
    Ok((Arc::new(db), closed_rx))
}

fn synced() -> WriteOptions {
    let mut options = WriteOptions::default();
    options.set_sync(true);
    options
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, AnyError> {
    db.cf_handle(name)
        .ok_or_else(|| AnyError::error(format!("column family {name} is missing")))
}

fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn index_of_key(key: &[u8]) -> Result<u64, AnyError> {
    let bytes: [u8; 8] = key
        .try_into()
        .map_err(|_| AnyError::error(format!("log key has {} bytes, expected 8", key.len())))?;
    Ok(u64::from_be_bytes(bytes))
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, AnyError> {
    serde_json::to_vec(value).map_err(|e| AnyError::new(&e))
}

fn from_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, AnyError> {
    serde_json::from_slice(bytes).map_err(|e| AnyError::new(&e))
}

fn get_json<T: for<'de> Deserialize<'de>>(
    db: &DB,
    family: &str,
    key: &[u8],
) -> Result<Option<T>, AnyError> {
    match db
        .get_cf(cf(db, family)?, key)
        .map_err(|e| AnyError::new(&e))?
    {
        Some(bytes) => Ok(Some(from_json(&bytes)?)),
        None => Ok(None),
    }
}

fn put_json_synced<T: Serialize>(
    db: &DB,
    family: &str,
    key: &[u8],
    value: &T,
) -> Result<(), AnyError> {
    db.put_cf_opt(cf(db, family)?, key, to_json(value)?, &synced())
        .map_err(|e| AnyError::new(&e))
}

/// The Raft log and the vote. Cloning shares the database.
#[derive(Clone)]
pub struct MetadataLogStore {
    db: Arc<MetadataDb>,
}

impl MetadataLogStore {
    pub fn new(db: Arc<MetadataDb>) -> Self {
        Self { db }
    }

    fn last_purged(&self) -> StorageResult<Option<LogId<RaftNodeId>>> {
        get_json(&self.db, CF_LOG_META, KEY_LAST_PURGED)
            .map_err(|e| StorageIOError::read_logs(e).into())
    }

    fn last_entry_log_id(&self) -> StorageResult<Option<LogId<RaftNodeId>>> {
        let logs = cf(&self.db, CF_LOGS).map_err(StorageIOError::read_logs)?;
        match self.db.iterator_cf(logs, IteratorMode::End).next() {
            Some(item) => {
                let (_, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
                let entry: Entry<TypeConfig> =
                    from_json(&value).map_err(StorageIOError::read_logs)?;
                Ok(Some(entry.log_id))
            }
            None => Ok(None),
        }
    }
}

impl RaftLogReader<TypeConfig> for MetadataLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(&index) => index,
            Bound::Excluded(&index) => match index.checked_add(1) {
                Some(index) => index,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let logs = cf(&self.db, CF_LOGS).map_err(StorageIOError::read_logs)?;
        let start_key = log_key(start);
        let mut entries = Vec::new();
        for item in self
            .db
            .iterator_cf(logs, IteratorMode::From(&start_key, Direction::Forward))
        {
            let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let index = index_of_key(&key).map_err(StorageIOError::read_logs)?;
            if !range.contains(&index) {
                break;
            }
            let entry: Entry<TypeConfig> = from_json(&value).map_err(StorageIOError::read_logs)?;
            // The key is derived from the entry when it is written; a mismatch
            // means the store is corrupt, and Raft must not run on it.
            if entry.log_id.index != index {
                return Err(StorageIOError::read_log_at_index(
                    index,
                    AnyError::error(format!(
                        "entry under key {index} has index {}",
                        entry.log_id.index
                    )),
                )
                .into());
            }
            entries.push(entry);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for MetadataLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged_log_id = self.last_purged()?;
        let last_log_id = self.last_entry_log_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<RaftNodeId>) -> StorageResult<()> {
        put_json_synced(&self.db, CF_LOG_META, KEY_VOTE, vote)
            .map_err(|e| StorageIOError::write_vote(e).into())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<RaftNodeId>>> {
        get_json(&self.db, CF_LOG_META, KEY_VOTE).map_err(|e| StorageIOError::read_vote(e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId<RaftNodeId>>) -> StorageResult<()> {
        put_json_synced(&self.db, CF_LOG_META, KEY_COMMITTED, &committed)
            .map_err(|e| StorageIOError::write_logs(e).into())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<RaftNodeId>>> {
        let committed: Option<Option<LogId<RaftNodeId>>> =
            get_json(&self.db, CF_LOG_META, KEY_COMMITTED).map_err(StorageIOError::read_logs)?;
        Ok(committed.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let logs = cf(&self.db, CF_LOGS).map_err(StorageIOError::write_logs)?;
        let mut batch = WriteBatch::default();
        for entry in entries {
            let value =
                to_json(&entry).map_err(|e| StorageIOError::write_log_entry(entry.log_id, e))?;
            batch.put_cf(logs, log_key(entry.log_id.index), value);
        }
        // The callback tells openraft the entries are durable, so it must only
        // run once the synced write has returned.
        let result = self.db.write_opt(batch, &synced());
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(&e).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<RaftNodeId>) -> StorageResult<()> {
        let logs = cf(&self.db, CF_LOGS).map_err(StorageIOError::write_logs)?;
        let mut batch = WriteBatch::default();
        // No entry ever has index u64::MAX, so an exclusive end there covers the tail.
        batch.delete_range_cf(logs, log_key(log_id.index), log_key(u64::MAX));
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId<RaftNodeId>) -> StorageResult<()> {
        let logs = cf(&self.db, CF_LOGS).map_err(StorageIOError::write_logs)?;
        let log_meta = cf(&self.db, CF_LOG_META).map_err(StorageIOError::write_logs)?;
        let end = log_id.index.checked_add(1).ok_or_else(|| {
            StorageIOError::write_logs(AnyError::error("cannot purge up to index u64::MAX"))
        })?;
        // One batch, so the last purged id and the deletion land together: the
        // log state never claims entries that are already gone, or the reverse.
        let mut batch = WriteBatch::default();
        batch.put_cf(
            log_meta,
            KEY_LAST_PURGED,
            to_json(&log_id).map_err(StorageIOError::write_logs)?,
        );
        batch.delete_range_cf(logs, log_key(0), log_key(end));
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// A snapshot as kept in the `sm` column family.
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<RaftNodeId, BasicNode>,
    /// JSON of the `MetadataImage`.
    data: Vec<u8>,
}

/// The state machine: the applied image plus what openraft needs to resume.
pub struct MetadataStateMachine {
    db: Arc<MetadataDb>,
    last_applied: Option<LogId<RaftNodeId>>,
    last_membership: StoredMembership<RaftNodeId, BasicNode>,
    image: Arc<MetadataImage>,
    /// Publishes the image after every apply; `MetadataController` hands out receivers.
    image_tx: watch::Sender<Arc<MetadataImage>>,
}

impl MetadataStateMachine {
    /// Loads the applied state from `db` (all empty for a fresh store).
    pub fn open(db: Arc<MetadataDb>) -> Result<Self, StorageError<RaftNodeId>> {
        let read = |key| -> StorageResult<Option<Vec<u8>>> {
            let sm = cf(&db, CF_SM).map_err(StorageIOError::read_state_machine)?;
            db.get_cf(sm, key)
                .map_err(|e| StorageIOError::read_state_machine(&e).into())
        };
        let decode_error = StorageIOError::read_state_machine;
        let last_applied = match read(KEY_LAST_APPLIED)? {
            Some(bytes) => from_json(&bytes).map_err(decode_error)?,
            None => None,
        };
        let last_membership = match read(KEY_LAST_MEMBERSHIP)? {
            Some(bytes) => from_json(&bytes).map_err(decode_error)?,
            None => StoredMembership::default(),
        };
        let image: MetadataImage = match read(KEY_IMAGE)? {
            Some(bytes) => from_json(&bytes).map_err(decode_error)?,
            None => MetadataImage::default(),
        };
        let image = Arc::new(image);
        let (image_tx, _) = watch::channel(image.clone());
        Ok(Self {
            db,
            last_applied,
            last_membership,
            image,
            image_tx,
        })
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.image_tx.subscribe()
    }

    /// Writes the applied state in one synced batch, so a restart never sees an
    /// image from one log position and a last-applied id from another.
    fn persist(&self, snapshot: Option<&StoredSnapshot>) -> Result<(), AnyError> {
        let sm = cf(&self.db, CF_SM)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(sm, KEY_LAST_APPLIED, to_json(&self.last_applied)?);
        batch.put_cf(sm, KEY_LAST_MEMBERSHIP, to_json(&self.last_membership)?);
        batch.put_cf(sm, KEY_IMAGE, to_json(self.image.as_ref())?);
        if let Some(snapshot) = snapshot {
            batch.put_cf(sm, KEY_SNAPSHOT, to_json(snapshot)?);
        }
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| AnyError::new(&e))
    }
}

impl RaftStateMachine<TypeConfig> for MetadataStateMachine {
    type SnapshotBuilder = MetadataSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(
        Option<LogId<RaftNodeId>>,
        StoredMembership<RaftNodeId, BasicNode>,
    )> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> StorageResult<Vec<Result<MetadataOutcome, MetadataError>>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut responses = Vec::new();
        let mut changed = false;
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => Ok(MetadataOutcome::Done),
                EntryPayload::Normal(cmd) => {
                    changed = true;
                    // Receivers may still hold the published image, so the
                    // first command of a batch copies it; later ones reuse the copy.
                    Arc::make_mut(&mut self.image).apply(&cmd)
                }
                EntryPayload::Membership(membership) => {
                    self.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    Ok(MetadataOutcome::Done)
                }
            };
            responses.push(response);
        }
        let last_applied = self.last_applied;
        self.persist(None).map_err(|e| match last_applied {
            Some(log_id) => StorageIOError::apply(log_id, e),
            None => StorageIOError::write_state_machine(e),
        })?;
        if changed {
            self.image_tx.send_replace(self.image.clone());
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        MetadataSnapshotBuilder {
            db: self.db.clone(),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
            image: self.image.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<RaftNodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let image: MetadataImage = from_json(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), e))?;
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        self.image = Arc::new(image);
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist(Some(&stored))
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), e))?;
        self.image_tx.send_replace(self.image.clone());
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored: Option<StoredSnapshot> = get_json(&self.db, CF_SM, KEY_SNAPSHOT)
            .map_err(|e| StorageIOError::read_snapshot(None, e))?;
        Ok(stored.map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

/// Builds a snapshot of the state as it was when the builder was taken, so
/// applies that happen while it runs do not tear it.
pub struct MetadataSnapshotBuilder {
    db: Arc<MetadataDb>,
    last_applied: Option<LogId<RaftNodeId>>,
    last_membership: StoredMembership<RaftNodeId, BasicNode>,
    image: Arc<MetadataImage>,
}

impl RaftSnapshotBuilder<TypeConfig> for MetadataSnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let data =
            to_json(self.image.as_ref()).map_err(|e| StorageIOError::write_snapshot(None, e))?;
        let snapshot_id = match self.last_applied {
            Some(log_id) => format!(
                "{}-{}-{}",
                log_id.leader_id,
                log_id.index,
                uuid::Uuid::new_v4().simple()
            ),
            None => format!("empty-{}", uuid::Uuid::new_v4().simple()),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.last_membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        put_json_synced(&self.db, CF_SM, KEY_SNAPSHOT, &stored)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};

    use super::*;

    /// Builds a fresh store in its own temporary directory for each suite test;
    /// the `TempDir` guard keeps the directory until the test drops it.
    struct TempStoreBuilder;

    impl StoreBuilder<TypeConfig, MetadataLogStore, MetadataStateMachine, tempfile::TempDir>
        for TempStoreBuilder
    {
        async fn build(
            &self,
        ) -> StorageResult<(tempfile::TempDir, MetadataLogStore, MetadataStateMachine)> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
            let (db, _closed) = open_db(dir.path()).map_err(|e| StorageIOError::write(&e))?;
            let sm = MetadataStateMachine::open(db.clone())?;
            Ok((dir, MetadataLogStore::new(db), sm))
        }
    }

    #[test]
    fn openraft_storage_suite() -> StorageResult<()> {
        Suite::test_all(TempStoreBuilder)
    }
}
