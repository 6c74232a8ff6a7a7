//! All the classic groups one coordinator owns, and Kafka's rules for a
//! group that does not exist (yet): a first JoinGroup creates it, any other
//! request is answered as if the member were unknown.

use std::collections::HashMap;

use super::classic::validate_join_request;
use super::{
    ClassicGroup, ClassicGroupConfig, Completions, GenerationId, GroupError, GroupInstanceId,
    HeartbeatRequest, JoinOutcome, JoinRequest, JoinResponse, LeaveMember, LeaveOutcome, MemberId,
    Reply, SyncOutcome, SyncRequest, SyncResponse,
};

/// The classic groups of one coordinator, by group id. Sans-io like
/// [`ClassicGroup`]: the driver calls [`GroupCoordinator::tick`] at
/// [`GroupCoordinator::next_deadline_ms`].
#[derive(Clone, Debug)]
pub struct GroupCoordinator {
    config: ClassicGroupConfig,
    groups: HashMap<String, ClassicGroup>,
}

impl GroupCoordinator {
    pub fn new(config: ClassicGroupConfig) -> Self {
        GroupCoordinator {
            config,
            groups: HashMap::new(),
        }
    }

    pub fn config(&self) -> &ClassicGroupConfig {
        &self.config
    }

    pub fn group(&self, group_id: &str) -> Option<&ClassicGroup> {
        self.groups.get(group_id)
    }

    /// Adds a group rebuilt from `__consumer_offsets` at load time,
    /// replacing any group of the same id.
    pub fn insert_loaded(&mut self, group: ClassicGroup) {
        self.groups.insert(group.group_id().to_string(), group);
    }

    /// Every group, in no particular order (ListGroups).
    pub fn groups(&self) -> impl Iterator<Item = &ClassicGroup> {
        self.groups.values()
    }

    /// JoinGroup. A join without a member id creates the group; one with a
    /// member id for a group that does not exist is UNKNOWN_MEMBER_ID.
    pub fn join(&mut self, group_id: &str, request: JoinRequest, now_ms: i64) -> JoinOutcome {
        if let Err(e) = validate_join_request(group_id, &self.config, &request) {
            return immediate_join(JoinResponse::error(request.member_id, e));
        }
        if !self.groups.contains_key(group_id) {
            if !request.member_id.is_unknown() {
                return immediate_join(JoinResponse::error(
                    request.member_id,
                    GroupError::UnknownMemberId,
                ));
            }
            self.groups.insert(
                group_id.to_string(),
                ClassicGroup::new(group_id, self.config.clone(), now_ms),
            );
        }
        match self.groups.get_mut(group_id) {
            Some(group) => group.join(request, now_ms),
            None => immediate_join(JoinResponse::error(
                request.member_id,
                GroupError::UnknownMemberId,
            )),
        }
    }

    pub fn sync(&mut self, group_id: &str, request: SyncRequest, now_ms: i64) -> SyncOutcome {
        match self.groups.get_mut(group_id) {
            Some(group) => group.sync(request, now_ms),
            None => SyncOutcome {
                reply: Reply::Now(SyncResponse::error(GroupError::UnknownMemberId)),
                completed: Completions::default(),
            },
        }
    }

    pub fn heartbeat(
        &mut self,
        group_id: &str,
        request: &HeartbeatRequest,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        self.groups
            .get_mut(group_id)
            .ok_or(GroupError::UnknownMemberId)?
            .heartbeat(request, now_ms)
    }

    pub fn leave(&mut self, group_id: &str, members: &[LeaveMember], now_ms: i64) -> LeaveOutcome {
        match self.groups.get_mut(group_id) {
            Some(group) => group.leave(members, now_ms),
            None => LeaveOutcome {
                result: Err(GroupError::UnknownMemberId),
                completed: Completions::default(),
            },
        }
    }

    /// DeleteGroups for one group: only an empty group can go.
    pub fn delete_group(&mut self, group_id: &str, now_ms: i64) -> Result<(), GroupError> {
        let group = self
            .groups
            .get_mut(group_id)
            .ok_or(GroupError::GroupIdNotFound)?;
        group.delete(now_ms)?;
        self.groups.remove(group_id);
        Ok(())
    }

    /// Kafka's OffsetCommit check. A commit with a negative generation to a
    /// group that does not exist creates a "simple" (empty) group, as admin
    /// clients and consumers that assign partitions themselves expect.
    /// OffsetCommit v9+ reports a missing group as GROUP_ID_NOT_FOUND, older
    /// versions as ILLEGAL_GENERATION.
    pub fn validate_offset_commit(
        &mut self,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        reports_group_id_not_found: bool,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        self.validate_commit(
            group_id,
            member_id,
            group_instance_id,
            generation_id,
            reports_group_id_not_found,
            false,
            now_ms,
        )
    }

    /// Kafka's TxnOffsetCommit check (`validateTransactionalOffsetCommit`):
    /// as OffsetCommit's, except that a commit without a member id is
    /// accepted whatever the group's state (the producer need not be a
    /// member) and a rebalance in progress does not refuse it. A missing
    /// group with a generation is ILLEGAL_GENERATION (GROUP_ID_NOT_FOUND
    /// only from TxnOffsetCommit v6, which is not served).
    pub fn validate_txn_offset_commit(
        &mut self,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        self.validate_commit(
            group_id,
            member_id,
            group_instance_id,
            generation_id,
            false,
            true,
            now_ms,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn validate_commit(
        &mut self,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        reports_group_id_not_found: bool,
        is_transactional: bool,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        if !self.groups.contains_key(group_id) {
            if generation_id.0 >= 0 {
                return Err(if reports_group_id_not_found {
                    GroupError::GroupIdNotFound
                } else {
                    GroupError::IllegalGeneration
                });
            }
            if group_id.is_empty() {
                return Err(GroupError::InvalidGroupId);
            }
            self.groups.insert(
                group_id.to_string(),
                ClassicGroup::new(group_id, self.config.clone(), now_ms),
            );
        }
        match self.groups.get(group_id) {
            Some(group) => group.validate_offset_commit(
                member_id,
                group_instance_id,
                generation_id,
                is_transactional,
            ),
            None => Err(GroupError::GroupIdNotFound),
        }
    }

    /// Fires every group's due deadlines; returns, per group, the parked
    /// responses that became ready.
    pub fn tick(&mut self, now_ms: i64) -> Vec<(String, Completions)> {
        let mut ready = Vec::new();
        for (group_id, group) in &mut self.groups {
            if group.next_deadline_ms().is_some_and(|d| d <= now_ms) {
                let completed = group.tick(now_ms);
                if !completed.is_empty() {
                    ready.push((group_id.clone(), completed));
                }
            }
        }
        ready
    }

    /// The earliest deadline of any group.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        self.groups
            .values()
            .filter_map(ClassicGroup::next_deadline_ms)
            .min()
    }

    /// This broker stops coordinating these groups; parked requests are
    /// answered NOT_COORDINATOR and the groups are dropped.
    pub fn unload(&mut self, group_ids: &[&str], now_ms: i64) -> Vec<(String, Completions)> {
        let mut ready = Vec::new();
        for group_id in group_ids {
            if let Some(mut group) = self.groups.remove(*group_id) {
                ready.push((group_id.to_string(), group.unload(now_ms)));
            }
        }
        ready
    }
}

fn immediate_join(response: JoinResponse) -> JoinOutcome {
    JoinOutcome {
        reply: Reply::Now(response),
        completed: Completions::default(),
    }
}
