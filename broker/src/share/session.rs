//! Share sessions (KIP-932): the set of share-partitions a member fetches
//! from one broker, kept between ShareFetch requests so an incremental
//! request names only what changed. Keyed by group and member; the
//! `ShareSessionEpoch` of each request must follow the session's.
//!
//! Kafka's rules (`SharePartitionManager.newContext`,
//! `acknowledgeSessionUpdate`):
//! - epoch 0 opens a session (replacing the member's existing one) with the
//!   request's partitions; it may not carry acknowledgements;
//! - epoch -1 closes it: a ShareFetch with it may carry acknowledgements
//!   but no partitions to fetch; the member's records in the session's
//!   partitions are then released;
//! - any other epoch must equal the session's, which then advances (after
//!   `i32::MAX` comes 1); a ShareAcknowledge may not open a session.
//!
//! Invariant: no clock and no I/O; the caller passes the time.

use std::collections::HashMap;

use uuid::Uuid;

pub const INITIAL_EPOCH: i32 = 0;
pub const FINAL_EPOCH: i32 = -1;

/// A share-partition as a session names it.
pub type SessionPartition = (Uuid, i32);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionError {
    /// `SHARE_SESSION_NOT_FOUND`.
    NotFound,
    /// `INVALID_SHARE_SESSION_EPOCH`.
    InvalidEpoch,
    /// `INVALID_REQUEST`: acknowledgements in an opening fetch, or
    /// partitions in a closing one.
    InvalidRequest,
    /// `SHARE_SESSION_LIMIT_REACHED`.
    LimitReached,
}

/// What a ShareFetch works on once its session is resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchContext {
    /// A session was opened (epoch 0) or continued: fetch from these, in
    /// the session's order.
    Fetch(Vec<SessionPartition>),
    /// The session was closed (epoch -1): apply the acknowledgements, fetch
    /// nothing, then release the member's records in these.
    Close(Vec<SessionPartition>),
}

#[derive(Debug)]
struct Session {
    epoch: i32,
    partitions: Vec<SessionPartition>,
    last_used_ms: i64,
    /// The connection that opened it: the session ends when it closes.
    connection: Option<u64>,
}

#[derive(Debug)]
pub struct ShareSessions {
    max_sessions: usize,
    sessions: HashMap<(String, String), Session>,
}

fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

impl ShareSessions {
    /// `max_sessions` is `group.share.max.share.sessions`.
    pub fn new(max_sessions: usize) -> Self {
        ShareSessions {
            max_sessions,
            sessions: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Resolves a ShareFetch's session: `fetch` are the partitions the
    /// request names, `forget` those it drops, `has_acks` whether it carries
    /// acknowledgements.
    #[allow(clippy::too_many_arguments)]
    pub fn fetch(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        fetch: &[SessionPartition],
        forget: &[SessionPartition],
        has_acks: bool,
        now_ms: i64,
    ) -> Result<FetchContext, SessionError> {
        let key = (group.to_string(), member.to_string());
        match epoch {
            FINAL_EPOCH => {
                if !fetch.is_empty() {
                    return Err(SessionError::InvalidRequest);
                }
                let session = self.sessions.remove(&key).ok_or(SessionError::NotFound)?;
                Ok(FetchContext::Close(session.partitions))
            }
            INITIAL_EPOCH => {
                if has_acks {
                    return Err(SessionError::InvalidRequest);
                }
                // Reopening replaces the member's own session, so only a
                // new member can find the cache full.
                self.sessions.remove(&key);
                if self.sessions.len() >= self.max_sessions {
                    return Err(SessionError::LimitReached);
                }
                let mut partitions = Vec::with_capacity(fetch.len());
                for p in fetch {
                    if !partitions.contains(p) {
                        partitions.push(*p);
                    }
                }
                self.sessions.insert(
                    key,
                    Session {
                        epoch: next_epoch(INITIAL_EPOCH),
                        partitions: partitions.clone(),
                        last_used_ms: now_ms,
                        connection: None,
                    },
                );
                Ok(FetchContext::Fetch(partitions))
            }
            _ => {
                let session = self.sessions.get_mut(&key).ok_or(SessionError::NotFound)?;
                if session.epoch != epoch {
                    return Err(SessionError::InvalidEpoch);
                }
                session.partitions.retain(|p| !forget.contains(p));
                for p in fetch {
                    if !session.partitions.contains(p) {
                        session.partitions.push(*p);
                    }
                }
                session.epoch = next_epoch(epoch);
                session.last_used_ms = now_ms;
                Ok(FetchContext::Fetch(session.partitions.clone()))
            }
        }
    }

    /// Resolves a ShareAcknowledge's session. `Ok(Some(partitions))` when it
    /// closes the session (epoch -1): after applying the acknowledgements,
    /// release the member's records in these.
    pub fn acknowledge(
        &mut self,
        group: &str,
        member: &str,
        epoch: i32,
        now_ms: i64,
    ) -> Result<Option<Vec<SessionPartition>>, SessionError> {
        if epoch == INITIAL_EPOCH {
            return Err(SessionError::InvalidEpoch);
        }
        let key = (group.to_string(), member.to_string());
        if epoch == FINAL_EPOCH {
            let session = self.sessions.remove(&key).ok_or(SessionError::NotFound)?;
            return Ok(Some(session.partitions));
        }
        let session = self.sessions.get_mut(&key).ok_or(SessionError::NotFound)?;
        if session.epoch != epoch {
            return Err(SessionError::InvalidEpoch);
        }
        session.epoch = next_epoch(epoch);
        session.last_used_ms = now_ms;
        Ok(None)
    }

    /// Drops the member's session (it left the group, or its connection
    /// closed); returns its partitions so the caller releases its records.
    pub fn remove(&mut self, group: &str, member: &str) -> Option<Vec<SessionPartition>> {
        self.sessions
            .remove(&(group.to_string(), member.to_string()))
            .map(|s| s.partitions)
    }

    /// Ties the member's session to the connection that opened it.
    pub fn bind(&mut self, group: &str, member: &str, connection: u64) {
        if let Some(s) = self
            .sessions
            .get_mut(&(group.to_string(), member.to_string()))
        {
            s.connection = Some(connection);
        }
    }

    /// Drops the sessions `connection` opened (it closed); returns them.
    pub fn close_connection(&mut self, connection: u64) -> Vec<(String, String)> {
        let gone: Vec<(String, String)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.connection == Some(connection))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &gone {
            self.sessions.remove(k);
        }
        gone
    }

    /// Every (group, share-partition) some session fetches.
    pub fn in_use(&self) -> std::collections::HashSet<(String, SessionPartition)> {
        self.sessions
            .iter()
            .flat_map(|((group, _), s)| s.partitions.iter().map(move |p| (group.clone(), *p)))
            .collect()
    }

    /// Drops sessions unused since `idle_before_ms`; returns them.
    pub fn expire(&mut self, idle_before_ms: i64) -> Vec<(String, String, Vec<SessionPartition>)> {
        let idle: Vec<(String, String)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.last_used_ms < idle_before_ms)
            .map(|(k, _)| k.clone())
            .collect();
        idle.into_iter()
            .filter_map(|k| {
                let s = self.sessions.remove(&k)?;
                Some((k.0, k.1, s.partitions))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> SessionPartition {
        (Uuid::from_u128(7), p)
    }

    #[test]
    fn epochs_follow_the_session_and_incremental_requests_change_it() {
        let mut s = ShareSessions::new(10);
        assert_eq!(
            s.fetch("g", "m", 0, &[tp(0), tp(1), tp(0)], &[], false, 0),
            Ok(FetchContext::Fetch(vec![tp(0), tp(1)]))
        );
        assert_eq!(
            s.fetch("g", "m", 1, &[tp(2)], &[tp(0)], true, 1),
            Ok(FetchContext::Fetch(vec![tp(1), tp(2)]))
        );
        assert_eq!(s.acknowledge("g", "m", 2, 2), Ok(None));
        // A stale or skipped epoch is refused and changes nothing.
        assert_eq!(
            s.fetch("g", "m", 2, &[], &[], false, 3),
            Err(SessionError::InvalidEpoch)
        );
        assert_eq!(
            s.acknowledge("g", "m", 5, 3),
            Err(SessionError::InvalidEpoch)
        );
        assert_eq!(
            s.fetch("g", "m", 3, &[], &[], false, 3),
            Ok(FetchContext::Fetch(vec![tp(1), tp(2)]))
        );
        assert_eq!(
            s.fetch("g", "other", 1, &[], &[], false, 3),
            Err(SessionError::NotFound)
        );
    }

    #[test]
    fn opening_replaces_and_closing_returns_the_partitions() {
        let mut s = ShareSessions::new(10);
        s.fetch("g", "m", 0, &[tp(0)], &[], false, 0).unwrap();
        assert_eq!(
            s.fetch("g", "m", 0, &[tp(1)], &[], true, 0),
            Err(SessionError::InvalidRequest)
        );
        assert_eq!(
            s.fetch("g", "m", 0, &[tp(1)], &[], false, 0),
            Ok(FetchContext::Fetch(vec![tp(1)]))
        );
        assert_eq!(
            s.fetch("g", "m", -1, &[tp(1)], &[], true, 0),
            Err(SessionError::InvalidRequest)
        );
        assert_eq!(
            s.fetch("g", "m", -1, &[], &[], true, 0),
            Ok(FetchContext::Close(vec![tp(1)]))
        );
        assert_eq!(
            s.fetch("g", "m", -1, &[], &[], true, 0),
            Err(SessionError::NotFound)
        );
        s.fetch("g", "m", 0, &[tp(3)], &[], false, 0).unwrap();
        assert_eq!(
            s.acknowledge("g", "m", 0, 0),
            Err(SessionError::InvalidEpoch)
        );
        assert_eq!(s.acknowledge("g", "m", -1, 0), Ok(Some(vec![tp(3)])));
        assert!(s.is_empty());
    }

    #[test]
    fn the_session_limit_is_kept_and_idle_sessions_expire() {
        let mut s = ShareSessions::new(2);
        s.fetch("g", "a", 0, &[tp(0)], &[], false, 0).unwrap();
        s.fetch("g", "b", 0, &[tp(0)], &[], false, 5).unwrap();
        assert_eq!(
            s.fetch("g", "c", 0, &[tp(0)], &[], false, 5),
            Err(SessionError::LimitReached)
        );
        // Reopening one's own session is not a new one.
        s.fetch("g", "a", 0, &[tp(1)], &[], false, 6).unwrap();
        assert_eq!(s.expire(6), vec![("g".into(), "b".into(), vec![tp(0)])]);
        assert_eq!(s.len(), 1);
        assert_eq!(s.remove("g", "a"), Some(vec![tp(1)]));
    }
}
