//! One classic group: its members, its state machine and its timers.
//!
//! The rules follow Kafka's `GroupMetadataManager` (classic half) and
//! `ClassicGroup`; method names mirror Kafka's so the two can be read side by
//! side. Kafka's timer keys become fields here: a join timer (initial
//! rebalance delay or rebalance timeout), a sync timer (members that were
//! told the new generation but never sent SyncGroup), and one heartbeat
//! deadline per member and per pending member.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use indexmap::IndexMap;

use super::{
    ClassicGroupConfig, Completions, GenerationId, GroupError, GroupInstanceId, GroupMetadata,
    GroupState, HeartbeatRequest, JoinOutcome, JoinRequest, JoinResponse, JoinResponseMember,
    LeaveMember, LeaveMemberResponse, LeaveOutcome, MemberId, MemberMetadata, Protocol, Reply,
    SyncOutcome, SyncRequest, SyncResponse,
};

/// A member of a classic group.
#[derive(Clone, Debug)]
struct Member {
    member_id: MemberId,
    group_instance_id: Option<GroupInstanceId>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    session_timeout_ms: i32,
    protocol_type: String,
    /// In the member's order of preference.
    protocols: Vec<Protocol>,
    assignment: Bytes,
    /// A JoinGroup from this member is parked.
    awaiting_join: bool,
    /// A SyncGroup from this member is parked.
    awaiting_sync: bool,
    /// Joined but not yet part of a completed join phase. Such a member
    /// cannot heartbeat (it has no generation yet), so only the new-member
    /// join timeout protects the group from it.
    is_new: bool,
    heartbeat_deadline_ms: Option<i64>,
}

impl Member {
    /// Kafka's `ClassicGroupMember.hasSatisfiedHeartbeat`: a member whose
    /// request is parked is obviously alive, unless it is new.
    fn has_satisfied_heartbeat(&self) -> bool {
        !self.is_new && (self.awaiting_join || self.awaiting_sync)
    }

    fn matches(&self, protocols: &[Protocol]) -> bool {
        self.protocols == protocols
    }

    fn supports(&self, protocol_name: &str) -> bool {
        self.protocols.iter().any(|p| p.name == protocol_name)
    }

    /// The member's most preferred protocol among the candidates.
    fn vote<'a>(&'a self, candidates: &HashSet<&str>) -> Option<&'a str> {
        self.protocols
            .iter()
            .map(|p| p.name.as_str())
            .find(|name| candidates.contains(name))
    }

    fn metadata(&self, protocol_name: Option<&str>) -> Bytes {
        protocol_name
            .and_then(|name| self.protocols.iter().find(|p| p.name == name))
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }
}

/// A member as DescribeGroups reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView<'a> {
    pub member_id: &'a MemberId,
    pub group_instance_id: Option<&'a GroupInstanceId>,
    pub client_id: &'a str,
    pub client_host: &'a str,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// The member's metadata for the group's selected protocol.
    pub metadata: Bytes,
    pub assignment: &'a Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JoinTimerKind {
    /// The first rebalance of an empty group waits `delay_ms` for more
    /// members, then again while new ones keep arriving, for at most
    /// `remaining_ms` more.
    InitialRebalanceDelay { delay_ms: i64, remaining_ms: i64 },
    /// The rebalance timeout: members that have not rejoined by then are
    /// removed.
    RebalanceTimeout,
}

#[derive(Clone, Copy, Debug)]
struct JoinTimer {
    deadline_ms: i64,
    kind: JoinTimerKind,
}

#[derive(Clone, Copy, Debug)]
struct SyncTimer {
    deadline_ms: i64,
    /// The generation whose SyncGroups are awaited; a timer outliving its
    /// generation does nothing.
    generation_id: GenerationId,
}

/// A timer that is due, in the order `tick` fires them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Join,
    Sync,
    Heartbeat(MemberId),
    PendingMember(MemberId),
}

/// One classic consumer group. See the module docs of [`crate::group`].
#[derive(Clone, Debug)]
pub struct ClassicGroup {
    group_id: String,
    config: ClassicGroupConfig,
    state: GroupState,
    previous_state: GroupState,
    state_timestamp_ms: i64,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    generation_id: GenerationId,
    leader_id: Option<MemberId>,
    /// In join order, so the leader chosen after the old one leaves is the
    /// longest-standing member and tests are deterministic.
    members: IndexMap<MemberId, Member>,
    static_members: HashMap<GroupInstanceId, MemberId>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with the deadline by
    /// which the member must join again with it.
    pending_join_members: IndexMap<MemberId, i64>,
    /// Members told the new generation that have not sent SyncGroup yet.
    pending_sync_members: HashSet<MemberId>,
    /// A member joined during the initial rebalance delay, which extends it.
    new_member_added: bool,
    join_timer: Option<JoinTimer>,
    sync_timer: Option<SyncTimer>,
    /// Responses that became ready during the current call.
    outbox: Completions,
}

impl ClassicGroup {
    /// A new, empty group. Like Kafka, the first call's completions ask for
    /// its (empty) metadata to be stored, so the group exists in the log.
    pub fn new(group_id: impl Into<String>, config: ClassicGroupConfig, now_ms: i64) -> Self {
        let mut group = Self::empty(group_id.into(), config, now_ms);
        group.outbox.group_metadata_changed = true;
        group
    }

    fn empty(group_id: String, config: ClassicGroupConfig, now_ms: i64) -> Self {
        ClassicGroup {
            group_id,
            config,
            state: GroupState::Empty,
            previous_state: GroupState::Dead,
            state_timestamp_ms: now_ms,
            protocol_type: None,
            protocol_name: None,
            generation_id: GenerationId(0),
            leader_id: None,
            members: IndexMap::new(),
            static_members: HashMap::new(),
            pending_join_members: IndexMap::new(),
            pending_sync_members: HashSet::new(),
            new_member_added: false,
            join_timer: None,
            sync_timer: None,
            outbox: Completions::default(),
        }
    }

    /// Rebuilds a group from its stored metadata (Kafka's `replay` then
    /// `onLoaded`): Stable with its members, or Empty. Every member's
    /// session starts now. A group over `group.max.size` (the limit was
    /// lowered) rebalances at once so the extra members are turned away.
    pub fn from_group_metadata(
        group_id: impl Into<String>,
        config: ClassicGroupConfig,
        metadata: GroupMetadata,
        now_ms: i64,
    ) -> Self {
        let mut group = Self::empty(group_id.into(), config, metadata.current_state_timestamp_ms);
        group.generation_id = metadata.generation_id;
        group.protocol_type = metadata.protocol_type.filter(|t| !t.is_empty());
        group.protocol_name = metadata.protocol_name;
        let protocol_type = group.protocol_type.clone().unwrap_or_default();
        let protocol_name = group.protocol_name.clone().unwrap_or_default();
        for m in metadata.members {
            let rebalance_timeout_ms = if m.rebalance_timeout_ms < 0 {
                m.session_timeout_ms
            } else {
                m.rebalance_timeout_ms
            };
            if let Some(instance_id) = &m.group_instance_id {
                group
                    .static_members
                    .insert(instance_id.clone(), m.member_id.clone());
            }
            group.members.insert(
                m.member_id.clone(),
                Member {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    protocol_type: protocol_type.clone(),
                    protocols: vec![Protocol {
                        name: protocol_name.clone(),
                        metadata: m.subscription,
                    }],
                    assignment: m.assignment,
                    awaiting_join: false,
                    awaiting_sync: false,
                    is_new: false,
                    heartbeat_deadline_ms: Some(now_ms + i64::from(m.session_timeout_ms)),
                },
            );
        }
        // A stored leader that is not among the members would break the
        // one-leader rule; fall back to the first member, as on removal.
        group.leader_id = metadata
            .leader
            .filter(|l| group.members.contains_key(l))
            .or_else(|| group.members.keys().next().cloned());
        if !group.members.is_empty() {
            group.state = GroupState::Stable;
        }
        if group.members.len() > group.config.max_size {
            group.prepare_rebalance(now_ms);
        }
        group
    }

    /// The metadata to store for this group; see
    /// [`Completions::group_metadata_changed`].
    pub fn group_metadata(&self) -> GroupMetadata {
        let protocol_name = self.protocol_name.as_deref();
        GroupMetadata {
            protocol_type: self.protocol_type.clone(),
            generation_id: self.generation_id,
            protocol_name: self.protocol_name.clone(),
            leader: self.leader_id.clone(),
            current_state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .values()
                .map(|m| MemberMetadata {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(protocol_name),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    pub fn state(&self) -> GroupState {
        self.state
    }

    pub fn previous_state(&self) -> GroupState {
        self.previous_state
    }

    /// When the group entered its current state.
    pub fn state_timestamp_ms(&self) -> i64 {
        self.state_timestamp_ms
    }

    pub fn generation_id(&self) -> GenerationId {
        self.generation_id
    }

    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol_name.as_deref()
    }

    pub fn leader_id(&self) -> Option<&MemberId> {
        self.leader_id.as_ref()
    }

    pub fn num_members(&self) -> usize {
        self.members.len()
    }

    pub fn has_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    /// A member id handed out with MEMBER_ID_REQUIRED and not used yet.
    pub fn is_pending_member(&self, member_id: &str) -> bool {
        self.pending_join_members.contains_key(member_id)
    }

    pub fn static_member_id(&self, group_instance_id: &str) -> Option<&MemberId> {
        self.static_members.get(group_instance_id)
    }

    /// The members in join order.
    pub fn members(&self) -> impl Iterator<Item = MemberView<'_>> {
        let protocol_name = self.protocol_name.as_deref();
        self.members.values().map(move |m| MemberView {
            member_id: &m.member_id,
            group_instance_id: m.group_instance_id.as_ref(),
            client_id: &m.client_id,
            client_host: &m.client_host,
            session_timeout_ms: m.session_timeout_ms,
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            metadata: m.metadata(protocol_name),
            assignment: &m.assignment,
        })
    }

    /// The earliest time at which [`ClassicGroup::tick`] has something to do.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        let timers = [
            self.join_timer.map(|t| t.deadline_ms),
            self.sync_timer.map(|t| t.deadline_ms),
        ];
        timers
            .into_iter()
            .flatten()
            .chain(
                self.members
                    .values()
                    .filter_map(|m| m.heartbeat_deadline_ms),
            )
            .chain(self.pending_join_members.values().copied())
            .min()
    }

    // ---------------------------------------------------------------- JoinGroup

    /// Handles a JoinGroup request.
    pub fn join(&mut self, mut request: JoinRequest, now_ms: i64) -> JoinOutcome {
        if request.rebalance_timeout_ms < 0 {
            request.rebalance_timeout_ms = request.session_timeout_ms;
        }
        let reply = self.classic_group_join(request, now_ms);
        JoinOutcome {
            reply,
            completed: std::mem::take(&mut self.outbox),
        }
    }

    fn classic_group_join(&mut self, request: JoinRequest, now_ms: i64) -> Reply<JoinResponse> {
        let member_id = request.member_id.clone();
        if let Err(e) = validate_join_request(&self.group_id, &self.config, &request) {
            return Reply::Now(JoinResponse::error(member_id, e));
        }
        if !self.accept_joining_member(&member_id) {
            // Kafka removes the member too: in PreparingRebalance this kicks
            // out the last members to rejoin when the group is over its size.
            self.remove_member(&member_id);
            return Reply::Now(JoinResponse::error(
                MemberId::unknown(),
                GroupError::GroupMaxSizeReached,
            ));
        }
        if member_id.is_unknown() {
            self.classic_group_join_new_member(request, now_ms)
        } else {
            self.classic_group_join_existing_member(request, now_ms)
        }
    }

    fn accept_joining_member(&self, member_id: &MemberId) -> bool {
        match self.state {
            GroupState::Empty | GroupState::Dead => true,
            // Counting awaiting members rather than all members lets the
            // group shrink to its limit by turning away the last to rejoin.
            GroupState::PreparingRebalance => {
                self.members.get(member_id).is_some_and(|m| m.awaiting_join)
                    || self.num_awaiting_join() < self.config.max_size
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.members.contains_key(member_id) || self.members.len() < self.config.max_size
            }
        }
    }

    fn classic_group_join_new_member(
        &mut self,
        request: JoinRequest,
        now_ms: i64,
    ) -> Reply<JoinResponse> {
        if self.state == GroupState::Dead {
            return Reply::Now(JoinResponse::error(
                MemberId::unknown(),
                GroupError::CoordinatorNotAvailable,
            ));
        }
        if !self.supports_protocols(&request.protocol_type, &request.protocols) {
            return Reply::Now(JoinResponse::error(
                MemberId::unknown(),
                GroupError::InconsistentGroupProtocol,
            ));
        }
        let new_member_id =
            generate_member_id(&request.client_id, request.group_instance_id.as_ref());
        if let Some(instance_id) = request.group_instance_id.clone() {
            match self.static_members.get(&instance_id).cloned() {
                Some(old_member_id) => self.update_static_member_then_rebalance_or_complete_join(
                    request,
                    old_member_id,
                    new_member_id,
                    now_ms,
                ),
                None => {
                    self.add_member_then_rebalance_or_complete_join(request, new_member_id, now_ms)
                }
            }
        } else if request.requires_known_member_id {
            // The member must come back with this id. Until then it counts
            // as joining (the join phase waits for it) for one session.
            self.pending_join_members.insert(
                new_member_id.clone(),
                now_ms + i64::from(request.session_timeout_ms),
            );
            Reply::Now(JoinResponse::error(
                new_member_id,
                GroupError::MemberIdRequired,
            ))
        } else {
            self.add_member_then_rebalance_or_complete_join(request, new_member_id, now_ms)
        }
    }

    fn classic_group_join_existing_member(
        &mut self,
        request: JoinRequest,
        now_ms: i64,
    ) -> Reply<JoinResponse> {
        let member_id = request.member_id.clone();
        if self.state == GroupState::Dead {
            return Reply::Now(JoinResponse::error(
                member_id,
                GroupError::CoordinatorNotAvailable,
            ));
        }
        if !self.supports_protocols(&request.protocol_type, &request.protocols) {
            return Reply::Now(JoinResponse::error(
                member_id,
                GroupError::InconsistentGroupProtocol,
            ));
        }
        if self.pending_join_members.contains_key(&member_id) {
            // Pending ids are only handed to dynamic members; Kafka treats a
            // static one here as a bug and fails the request.
            if request.group_instance_id.is_some() {
                return Reply::Now(JoinResponse::error(member_id, GroupError::UnknownMemberId));
            }
            return self.add_member_then_rebalance_or_complete_join(request, member_id, now_ms);
        }
        if let Err(e) = self.validate_member(&member_id, request.group_instance_id.as_ref()) {
            return Reply::Now(JoinResponse::error(member_id, e));
        }
        let (is_leader, unchanged) = {
            let member = &self.members[&member_id];
            (
                self.is_leader(&member_id),
                member.matches(&request.protocols),
            )
        };
        match self.state {
            GroupState::PreparingRebalance => {
                self.update_member_then_rebalance_or_complete_join(&request, now_ms)
            }
            GroupState::CompletingRebalance if unchanged => {
                // The member probably lost the JoinGroup response: repeat it.
                let members = if is_leader {
                    self.current_members()
                } else {
                    Vec::new()
                };
                Reply::Now(self.current_join_response(
                    member_id,
                    members,
                    self.leader_or_unknown(),
                    false,
                ))
            }
            GroupState::CompletingRebalance => {
                self.update_member_then_rebalance_or_complete_join(&request, now_ms)
            }
            // The leader rejoins to trigger a rebalance for changes the
            // member metadata does not show (e.g. new partitions).
            GroupState::Stable if is_leader || !unchanged => {
                self.update_member_then_rebalance_or_complete_join(&request, now_ms)
            }
            GroupState::Stable => Reply::Now(self.current_join_response(
                member_id,
                Vec::new(),
                self.leader_or_unknown(),
                false,
            )),
            // Unreachable after validate_member (an empty group has no
            // members); the member resets its generation and rejoins.
            GroupState::Empty | GroupState::Dead => {
                Reply::Now(JoinResponse::error(member_id, GroupError::UnknownMemberId))
            }
        }
    }

    fn update_member_then_rebalance_or_complete_join(
        &mut self,
        request: &JoinRequest,
        now_ms: i64,
    ) -> Reply<JoinResponse> {
        self.update_member(&request.member_id, request);
        self.maybe_prepare_rebalance_or_complete_join(now_ms);
        Reply::Parked(request.member_id.clone())
    }

    /// Kafka's `ClassicGroup.updateMember`: new protocols and timeouts, and
    /// the member's JoinGroup is now parked.
    fn update_member(&mut self, member_id: &MemberId, request: &JoinRequest) {
        if let Some(member) = self.members.get_mut(member_id) {
            member.protocols = request.protocols.clone();
            member.rebalance_timeout_ms = request.rebalance_timeout_ms;
            member.session_timeout_ms = request.session_timeout_ms;
            member.awaiting_join = true;
        }
    }

    fn add_member_then_rebalance_or_complete_join(
        &mut self,
        request: JoinRequest,
        member_id: MemberId,
        now_ms: i64,
    ) -> Reply<JoinResponse> {
        if self.state == GroupState::PreparingRebalance && self.previous_state == GroupState::Empty
        {
            self.new_member_added = true;
        }
        let member = Member {
            member_id: member_id.clone(),
            group_instance_id: request.group_instance_id,
            client_id: request.client_id,
            client_host: request.client_host,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            session_timeout_ms: request.session_timeout_ms,
            protocol_type: request.protocol_type,
            protocols: request.protocols,
            assignment: Bytes::new(),
            awaiting_join: true,
            awaiting_sync: false,
            is_new: true,
            heartbeat_deadline_ms: Some(now_ms + self.config.new_member_join_timeout_ms),
        };
        self.add(member);
        self.maybe_prepare_rebalance_or_complete_join(now_ms);
        Reply::Parked(member_id)
    }

    /// Kafka's `ClassicGroup.add`. The caller has checked the protocols.
    fn add(&mut self, member: Member) {
        if let Some(instance_id) = &member.group_instance_id {
            self.static_members
                .insert(instance_id.clone(), member.member_id.clone());
        }
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        if self.leader_id.is_none() {
            self.leader_id = Some(member.member_id.clone());
        }
        self.pending_join_members.shift_remove(&member.member_id);
        self.members.insert(member.member_id.clone(), member);
    }

    /// A static member rejoined without its member id (it restarted): the
    /// new id takes over the old member, and the old id is fenced.
    fn update_static_member_then_rebalance_or_complete_join(
        &mut self,
        request: JoinRequest,
        old_member_id: MemberId,
        new_member_id: MemberId,
        now_ms: i64,
    ) -> Reply<JoinResponse> {
        if matches!(self.state, GroupState::Empty | GroupState::Dead) {
            // An empty or dead group has no static members; Kafka treats
            // this as a bug. Answer as for any unknown member.
            return Reply::Now(JoinResponse::error(
                MemberId::unknown(),
                GroupError::UnknownMemberId,
            ));
        }
        let Some(instance_id) = request.group_instance_id.clone() else {
            return Reply::Now(JoinResponse::error(
                MemberId::unknown(),
                GroupError::UnknownMemberId,
            ));
        };
        let current_leader = self.leader_or_unknown();
        self.replace_static_member(&instance_id, &old_member_id, &new_member_id);
        if let Some(member) = self.members.get_mut(&new_member_id) {
            member.heartbeat_deadline_ms = Some(now_ms + i64::from(member.session_timeout_ms));
        }
        self.update_member(&new_member_id, &request);

        match self.state {
            GroupState::Stable => {
                if self.select_protocol() == self.protocol_name {
                    // Same protocol: the group's assignment still holds, so
                    // the restarted member takes its old place without a
                    // rebalance.
                    if let Some(member) = self.members.get_mut(&new_member_id) {
                        member.awaiting_join = false;
                    }
                    // The stored metadata must name the new member id, or
                    // a restore would bring the fenced one back.
                    self.outbox.group_metadata_changed = true;
                    if request.supports_skip_assignment {
                        let is_leader = self.is_leader(&new_member_id);
                        let members = if is_leader {
                            self.current_members()
                        } else {
                            Vec::new()
                        };
                        Reply::Now(self.current_join_response(
                            new_member_id,
                            members,
                            self.leader_or_unknown(),
                            is_leader,
                        ))
                    } else {
                        // Older clients cannot skip the assignment, so a
                        // restarted leader is named by its old id: it then
                        // acts as a follower and keeps the current
                        // assignment instead of computing a new one.
                        Reply::Now(self.current_join_response(
                            new_member_id,
                            Vec::new(),
                            current_leader,
                            false,
                        ))
                    }
                } else {
                    self.maybe_prepare_rebalance_or_complete_join(now_ms);
                    Reply::Parked(new_member_id)
                }
            }
            GroupState::CompletingRebalance => {
                // The leader may already be assigning to the old id, so the
                // new id would get nothing: rebalance.
                self.prepare_rebalance(now_ms);
                Reply::Parked(new_member_id)
            }
            GroupState::PreparingRebalance | GroupState::Empty | GroupState::Dead => {
                self.maybe_complete_join_phase(now_ms);
                Reply::Parked(new_member_id)
            }
        }
    }

    /// Kafka's `ClassicGroup.replaceStaticMember`: the new member id keeps
    /// the old member's place, leadership and assignment; requests parked
    /// under the old id are answered FENCED_INSTANCE_ID.
    fn replace_static_member(
        &mut self,
        instance_id: &GroupInstanceId,
        old_member_id: &MemberId,
        new_member_id: &MemberId,
    ) {
        let Some((index, _, old)) = self.members.shift_remove_full(old_member_id) else {
            return;
        };
        if old.awaiting_join {
            self.outbox.joins.push((
                old_member_id.clone(),
                JoinResponse::error(old_member_id.clone(), GroupError::FencedInstanceId),
            ));
        }
        if old.awaiting_sync {
            self.outbox.syncs.push((
                old_member_id.clone(),
                SyncResponse::error(GroupError::FencedInstanceId),
            ));
        }
        let member = Member {
            member_id: new_member_id.clone(),
            awaiting_join: false,
            awaiting_sync: false,
            is_new: false,
            heartbeat_deadline_ms: None,
            ..old
        };
        self.members.insert(new_member_id.clone(), member);
        let last = self.members.len() - 1;
        self.members.move_index(last, index);
        if self.is_leader(old_member_id) {
            self.leader_id = Some(new_member_id.clone());
        }
        self.static_members
            .insert(instance_id.clone(), new_member_id.clone());
        if self.pending_sync_members.remove(old_member_id) {
            self.pending_sync_members.insert(new_member_id.clone());
        }
    }

    // ---------------------------------------------------------- rebalancing

    fn can_rebalance(&self) -> bool {
        GroupState::PreparingRebalance.can_follow(self.state)
    }

    fn maybe_prepare_rebalance_or_complete_join(&mut self, now_ms: i64) {
        if self.can_rebalance() {
            self.prepare_rebalance(now_ms);
        } else {
            self.maybe_complete_join_phase(now_ms);
        }
    }

    fn prepare_rebalance(&mut self, now_ms: i64) {
        if self.state == GroupState::CompletingRebalance {
            // Members waiting for an assignment that will not come rejoin.
            self.reset_and_propagate_assignment_with_error(GroupError::RebalanceInProgress, now_ms);
        }
        self.pending_sync_members.clear();
        self.sync_timer = None;

        let is_initial_rebalance = self.state == GroupState::Empty;
        if is_initial_rebalance {
            let delay_ms = self.config.initial_rebalance_delay_ms;
            let remaining_ms = (self.rebalance_timeout_ms() - delay_ms).max(0);
            self.join_timer = Some(JoinTimer {
                deadline_ms: now_ms + delay_ms,
                kind: JoinTimerKind::InitialRebalanceDelay {
                    delay_ms,
                    remaining_ms,
                },
            });
        }
        self.transition_to(GroupState::PreparingRebalance, now_ms);
        if !is_initial_rebalance {
            self.maybe_complete_join_else_schedule(now_ms);
        }
    }

    fn maybe_complete_join_else_schedule(&mut self, now_ms: i64) {
        if self.has_all_members_joined() {
            self.complete_join(now_ms);
        } else {
            self.schedule_rebalance_timeout(now_ms);
        }
    }

    fn schedule_rebalance_timeout(&mut self, now_ms: i64) {
        // A client may ask for a zero rebalance timeout; waiting at least a
        // millisecond keeps a group whose static members never rejoin from
        // spinning its driver until their sessions end.
        self.join_timer = Some(JoinTimer {
            deadline_ms: now_ms + self.rebalance_timeout_ms().max(1),
            kind: JoinTimerKind::RebalanceTimeout,
        });
    }

    /// Completes the join phase early once every member has rejoined, except
    /// in the initial rebalance, which always waits out its delay.
    fn maybe_complete_join_phase(&mut self, now_ms: i64) {
        if self.state == GroupState::PreparingRebalance
            && self.previous_state != GroupState::Empty
            && self.has_all_members_joined()
        {
            self.complete_join(now_ms);
        }
    }

    fn try_complete_initial_rebalance_else_schedule(
        &mut self,
        delay_ms: i64,
        remaining_ms: i64,
        now_ms: i64,
    ) {
        if self.new_member_added && remaining_ms != 0 {
            self.new_member_added = false;
            let new_delay_ms = self.config.initial_rebalance_delay_ms.min(remaining_ms);
            let new_remaining_ms = (remaining_ms - delay_ms).max(0);
            self.join_timer = Some(JoinTimer {
                deadline_ms: now_ms + new_delay_ms,
                kind: JoinTimerKind::InitialRebalanceDelay {
                    delay_ms: new_delay_ms,
                    remaining_ms: new_remaining_ms,
                },
            });
        } else {
            self.complete_join(now_ms);
        }
    }

    /// Kafka's `completeClassicGroupJoin`: drop the dynamic members that did
    /// not rejoin, start the next generation and answer the parked joins.
    fn complete_join(&mut self, now_ms: i64) {
        self.join_timer = None;
        // Static members are kept: they may be restarting, and their session
        // timeout decides whether they are gone.
        let not_rejoined: Vec<MemberId> = self
            .members
            .values()
            .filter(|m| !m.awaiting_join && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for member_id in &not_rejoined {
            self.remove_member(member_id);
        }
        if self.state == GroupState::Dead {
            return;
        }
        if !self.maybe_elect_new_joined_leader() && !self.members.is_empty() {
            // Only static members remain and none rejoined: wait another
            // rebalance timeout for them (or for their sessions to expire).
            self.schedule_rebalance_timeout(now_ms);
            return;
        }
        self.init_next_generation(now_ms);
        if self.state == GroupState::Empty {
            // The generation moved on without members; store that.
            self.outbox.group_metadata_changed = true;
            return;
        }
        let leader_members = self.current_members();
        let leader = self.leader_or_unknown();
        let member_ids: Vec<MemberId> = self.members.keys().cloned().collect();
        for member_id in member_ids {
            let members = if self.is_leader(&member_id) {
                leader_members.clone()
            } else {
                Vec::new()
            };
            let response =
                self.current_join_response(member_id.clone(), members, leader.clone(), false);
            let Some(member) = self.members.get_mut(&member_id) else {
                continue;
            };
            if member.awaiting_join {
                member.awaiting_join = false;
                self.outbox.joins.push((member_id.clone(), response));
            }
            member.heartbeat_deadline_ms = Some(now_ms + i64::from(member.session_timeout_ms));
            member.is_new = false;
            self.pending_sync_members.insert(member_id);
        }
        self.sync_timer = Some(SyncTimer {
            deadline_ms: now_ms + self.rebalance_timeout_ms(),
            generation_id: self.generation_id,
        });
    }

    /// Keeps the leader if it rejoined, else hands leadership to a member
    /// that did. False when nobody rejoined.
    fn maybe_elect_new_joined_leader(&mut self) -> bool {
        let Some(leader_id) = &self.leader_id else {
            return false;
        };
        if self.members.get(leader_id).is_some_and(|m| m.awaiting_join) {
            return true;
        }
        match self.members.values().find(|m| m.awaiting_join) {
            Some(member) => {
                self.leader_id = Some(member.member_id.clone());
                true
            }
            None => false,
        }
    }

    fn init_next_generation(&mut self, now_ms: i64) {
        self.generation_id = GenerationId(self.generation_id.0.wrapping_add(1));
        if self.members.is_empty() {
            self.protocol_name = None;
            self.transition_to(GroupState::Empty, now_ms);
        } else {
            self.protocol_name = self.select_protocol();
            self.transition_to(GroupState::CompletingRebalance, now_ms);
        }
        self.pending_sync_members.clear();
    }

    /// Kafka's protocol vote: among the protocols every member supports,
    /// each member votes for its most preferred; most votes wins. Ties go to
    /// the protocol voted for first, in join order.
    fn select_protocol(&self) -> Option<String> {
        let candidates: HashSet<&str> = self
            .members
            .values()
            .flat_map(|m| m.protocols.iter().map(|p| p.name.as_str()))
            .filter(|name| self.members.values().all(|m| m.supports(name)))
            .collect();
        let mut votes: IndexMap<&str, usize> = IndexMap::new();
        for member in self.members.values() {
            if let Some(name) = member.vote(&candidates) {
                *votes.entry(name).or_insert(0) += 1;
            }
        }
        let mut best: Option<(&str, usize)> = None;
        for (name, count) in votes {
            if best.is_none_or(|(_, c)| count > c) {
                best = Some((name, count));
            }
        }
        best.map(|(name, _)| name.to_string())
    }

    /// Whether a member with this protocol type and these protocols can be
    /// in the group: an empty group takes any non-empty set; otherwise the
    /// type must match and one protocol must be supported by every member.
    fn supports_protocols(&self, protocol_type: &str, protocols: &[Protocol]) -> bool {
        if self.state == GroupState::Empty {
            !protocol_type.is_empty() && !protocols.is_empty()
        } else {
            self.protocol_type.as_deref() == Some(protocol_type)
                && protocols
                    .iter()
                    .any(|p| self.members.values().all(|m| m.supports(&p.name)))
        }
    }

    // ---------------------------------------------------------------- SyncGroup

    /// Handles a SyncGroup request.
    pub fn sync(&mut self, request: SyncRequest, now_ms: i64) -> SyncOutcome {
        let reply = self.classic_group_sync(request, now_ms);
        SyncOutcome {
            reply,
            completed: std::mem::take(&mut self.outbox),
        }
    }

    fn classic_group_sync(&mut self, request: SyncRequest, now_ms: i64) -> Reply<SyncResponse> {
        if self.state == GroupState::Empty {
            return Reply::Now(SyncResponse::error(GroupError::UnknownMemberId));
        }
        if let Err(e) = self.validate_sync_group(&request) {
            return Reply::Now(SyncResponse::error(e));
        }
        let member_id = request.member_id;
        match self.state {
            GroupState::PreparingRebalance => {
                Reply::Now(SyncResponse::error(GroupError::RebalanceInProgress))
            }
            GroupState::CompletingRebalance => {
                if let Some(member) = self.members.get_mut(&member_id) {
                    member.awaiting_sync = true;
                }
                self.remove_pending_sync_member(&member_id);
                if self.is_leader(&member_id) {
                    // Kafka persists the assignment first, then answers; the
                    // driver does the same with what this call returns.
                    let assignment: HashMap<MemberId, Bytes> =
                        request.assignments.into_iter().collect();
                    self.set_and_propagate_assignment(&assignment, now_ms);
                    self.transition_to(GroupState::Stable, now_ms);
                    self.outbox.group_metadata_changed = true;
                }
                Reply::Parked(member_id)
            }
            GroupState::Stable => {
                self.remove_pending_sync_member(&member_id);
                let assignment = self
                    .members
                    .get(&member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                Reply::Now(SyncResponse {
                    error: None,
                    protocol_type: self.protocol_type.clone(),
                    protocol_name: self.protocol_name.clone(),
                    assignment,
                })
            }
            GroupState::Empty | GroupState::Dead => {
                Reply::Now(SyncResponse::error(GroupError::CoordinatorNotAvailable))
            }
        }
    }

    fn validate_sync_group(&self, request: &SyncRequest) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        self.validate_member(&request.member_id, request.group_instance_id.as_ref())?;
        if request.generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        if is_protocol_inconsistent(
            request.protocol_type.as_deref(),
            self.protocol_type.as_deref(),
        ) || is_protocol_inconsistent(
            request.protocol_name.as_deref(),
            self.protocol_name.as_deref(),
        ) {
            return Err(GroupError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    fn remove_pending_sync_member(&mut self, member_id: &MemberId) {
        self.pending_sync_members.remove(member_id);
        let keep_timer = matches!(
            self.state,
            GroupState::CompletingRebalance | GroupState::Stable
        ) && !self.pending_sync_members.is_empty();
        if !keep_timer {
            self.sync_timer = None;
        }
    }

    fn reset_and_propagate_assignment_with_error(&mut self, error: GroupError, now_ms: i64) {
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
        }
        self.propagate_assignment(Some(error), now_ms);
    }

    fn set_and_propagate_assignment(&mut self, assignment: &HashMap<MemberId, Bytes>, now_ms: i64) {
        for member in self.members.values_mut() {
            member.assignment = assignment
                .get(&member.member_id)
                .cloned()
                .unwrap_or_default();
        }
        self.propagate_assignment(None, now_ms);
    }

    /// Answers every parked SyncGroup. A member whose SyncGroup was parked
    /// could not heartbeat meanwhile, so its session restarts now.
    fn propagate_assignment(&mut self, error: Option<GroupError>, now_ms: i64) {
        let (protocol_type, protocol_name) = match error {
            None => (self.protocol_type.clone(), self.protocol_name.clone()),
            Some(_) => (None, None),
        };
        for member in self.members.values_mut() {
            if member.awaiting_sync {
                member.awaiting_sync = false;
                member.heartbeat_deadline_ms = Some(now_ms + i64::from(member.session_timeout_ms));
                self.outbox.syncs.push((
                    member.member_id.clone(),
                    SyncResponse {
                        error,
                        protocol_type: protocol_type.clone(),
                        protocol_name: protocol_name.clone(),
                        assignment: member.assignment.clone(),
                    },
                ));
            }
        }
    }

    // ---------------------------------------------------------------- Heartbeat

    /// Handles a Heartbeat request. A heartbeat never completes a parked
    /// request, so there is nothing else to return.
    pub fn heartbeat(&mut self, request: &HeartbeatRequest, now_ms: i64) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        self.validate_member(&request.member_id, request.group_instance_id.as_ref())?;
        if request.generation_id != self.generation_id {
            return Err(GroupError::IllegalGeneration);
        }
        match self.state {
            GroupState::Empty => Err(GroupError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                self.reschedule_heartbeat(&request.member_id, now_ms);
                Err(GroupError::RebalanceInProgress)
            }
            // Consumers may heartbeat between their JoinGroup response and
            // their SyncGroup; that is a normal heartbeat.
            GroupState::CompletingRebalance | GroupState::Stable => {
                self.reschedule_heartbeat(&request.member_id, now_ms);
                Ok(())
            }
            GroupState::Dead => Err(GroupError::CoordinatorNotAvailable),
        }
    }

    fn reschedule_heartbeat(&mut self, member_id: &MemberId, now_ms: i64) {
        if let Some(member) = self.members.get_mut(member_id) {
            member.heartbeat_deadline_ms = Some(now_ms + i64::from(member.session_timeout_ms));
        }
    }

    // --------------------------------------------------------------- LeaveGroup

    /// Handles a LeaveGroup request naming one or more members.
    pub fn leave(&mut self, members: &[LeaveMember], now_ms: i64) -> LeaveOutcome {
        if self.state == GroupState::Dead {
            return LeaveOutcome {
                result: Err(GroupError::CoordinatorNotAvailable),
                completed: std::mem::take(&mut self.outbox),
            };
        }
        let mut responses = Vec::with_capacity(members.len());
        for leaving in members {
            let error = self.remove_leaving_member(leaving).err();
            responses.push(LeaveMemberResponse {
                member_id: leaving.member_id.clone(),
                group_instance_id: leaving.group_instance_id.clone(),
                error,
            });
        }
        if responses.iter().any(|r| r.error.is_none()) {
            match self.state {
                GroupState::Stable | GroupState::CompletingRebalance => {
                    self.maybe_prepare_rebalance_or_complete_join(now_ms)
                }
                GroupState::PreparingRebalance => self.maybe_complete_join_phase(now_ms),
                GroupState::Empty | GroupState::Dead => {}
            }
        }
        LeaveOutcome {
            result: Ok(responses),
            completed: std::mem::take(&mut self.outbox),
        }
    }

    fn remove_leaving_member(&mut self, leaving: &LeaveMember) -> Result<(), GroupError> {
        if leaving.member_id.is_unknown() {
            // An admin removes a static member by its instance id alone.
            let member_id = leaving
                .group_instance_id
                .as_ref()
                .and_then(|id| self.static_members.get(id))
                .cloned()
                .ok_or(GroupError::UnknownMemberId)?;
            self.remove_member(&member_id);
            Ok(())
        } else if self
            .pending_join_members
            .shift_remove(&leaving.member_id)
            .is_some()
        {
            Ok(())
        } else {
            self.validate_member(&leaving.member_id, leaving.group_instance_id.as_ref())?;
            self.remove_member(&leaving.member_id);
            Ok(())
        }
    }

    // ------------------------------------------------------------------ timers

    /// Fires every deadline due at `now_ms`, in deadline order, and returns
    /// the parked responses that became ready.
    pub fn tick(&mut self, now_ms: i64) -> Completions {
        // A timer may schedule another at `now_ms` (a zero timeout); the
        // budget keeps one tick finite, and the rest fire on the next tick,
        // which next_deadline_ms already asks for.
        let mut budget = 2 * (self.members.len() + self.pending_join_members.len()) + 8;
        while budget > 0 {
            let Some(due) = self.earliest_due(now_ms) else {
                break;
            };
            self.fire(due, now_ms);
            budget -= 1;
        }
        std::mem::take(&mut self.outbox)
    }

    fn earliest_due(&self, now_ms: i64) -> Option<Due> {
        let mut due: Vec<(i64, Due)> = Vec::new();
        if let Some(t) = self.join_timer {
            due.push((t.deadline_ms, Due::Join));
        }
        if let Some(t) = self.sync_timer {
            due.push((t.deadline_ms, Due::Sync));
        }
        for m in self.members.values() {
            if let Some(deadline_ms) = m.heartbeat_deadline_ms {
                due.push((deadline_ms, Due::Heartbeat(m.member_id.clone())));
            }
        }
        for (member_id, deadline_ms) in &self.pending_join_members {
            due.push((*deadline_ms, Due::PendingMember(member_id.clone())));
        }
        due.into_iter()
            .filter(|(deadline_ms, _)| *deadline_ms <= now_ms)
            .min()
            .map(|(_, d)| d)
    }

    fn fire(&mut self, due: Due, now_ms: i64) {
        match due {
            Due::Join => {
                let Some(timer) = self.join_timer.take() else {
                    return;
                };
                match timer.kind {
                    JoinTimerKind::InitialRebalanceDelay {
                        delay_ms,
                        remaining_ms,
                    } => self.try_complete_initial_rebalance_else_schedule(
                        delay_ms,
                        remaining_ms,
                        now_ms,
                    ),
                    JoinTimerKind::RebalanceTimeout => self.complete_join(now_ms),
                }
            }
            Due::Sync => {
                if let Some(timer) = self.sync_timer.take() {
                    self.expire_pending_sync(timer.generation_id, now_ms);
                }
            }
            Due::Heartbeat(member_id) => self.expire_member_heartbeat(&member_id, now_ms),
            Due::PendingMember(member_id) => {
                self.pending_join_members.shift_remove(&member_id);
                if self.state == GroupState::PreparingRebalance && self.has_all_members_joined() {
                    self.complete_join(now_ms);
                }
            }
        }
    }

    /// Kafka's `expireClassicGroupMemberHeartbeat`. A member whose request is
    /// parked is spared; its session restarts when the request completes.
    fn expire_member_heartbeat(&mut self, member_id: &MemberId, now_ms: i64) {
        let Some(member) = self.members.get_mut(member_id) else {
            return;
        };
        member.heartbeat_deadline_ms = None;
        if member.has_satisfied_heartbeat() {
            return;
        }
        self.remove_member(member_id);
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.maybe_prepare_rebalance_or_complete_join(now_ms)
            }
            GroupState::PreparingRebalance if self.has_all_members_joined() => {
                self.complete_join(now_ms)
            }
            GroupState::PreparingRebalance | GroupState::Empty | GroupState::Dead => {}
        }
    }

    /// Members that were told the new generation but never sent SyncGroup
    /// within the rebalance timeout are removed, and the group rebalances.
    fn expire_pending_sync(&mut self, generation_id: GenerationId, now_ms: i64) {
        if generation_id != self.generation_id
            || !matches!(
                self.state,
                GroupState::CompletingRebalance | GroupState::Stable
            )
            || self.pending_sync_members.is_empty()
        {
            return;
        }
        let pending: Vec<MemberId> = self.pending_sync_members.iter().cloned().collect();
        for member_id in &pending {
            self.remove_member(member_id);
        }
        self.prepare_rebalance(now_ms);
    }

    // ------------------------------------------------------- deletion, unload

    /// Kafka's `validateDeleteGroup`: only an empty group can be deleted.
    pub fn validate_delete(&self) -> Result<(), GroupError> {
        match self.state {
            GroupState::Dead => Err(GroupError::GroupIdNotFound),
            GroupState::Stable
            | GroupState::PreparingRebalance
            | GroupState::CompletingRebalance => Err(GroupError::NonEmptyGroup),
            GroupState::Empty => Ok(()),
        }
    }

    /// DeleteGroups: an empty group becomes Dead; the caller drops it (and
    /// writes its tombstone).
    pub fn delete(&mut self, now_ms: i64) -> Result<(), GroupError> {
        self.validate_delete()?;
        self.pending_join_members.clear();
        self.join_timer = None;
        self.sync_timer = None;
        self.transition_to(GroupState::Dead, now_ms);
        Ok(())
    }

    /// This broker stops coordinating the group (its partition of the
    /// offsets topic moved): parked requests are answered NOT_COORDINATOR so
    /// clients look the coordinator up again.
    pub fn unload(&mut self, now_ms: i64) -> Completions {
        for member in self.members.values_mut() {
            if member.awaiting_join {
                member.awaiting_join = false;
                self.outbox.joins.push((
                    member.member_id.clone(),
                    JoinResponse::error(member.member_id.clone(), GroupError::NotCoordinator),
                ));
            }
            if member.awaiting_sync {
                member.awaiting_sync = false;
                self.outbox.syncs.push((
                    member.member_id.clone(),
                    SyncResponse::error(GroupError::NotCoordinator),
                ));
            }
            member.heartbeat_deadline_ms = None;
        }
        self.pending_join_members.clear();
        self.join_timer = None;
        self.sync_timer = None;
        self.transition_to(GroupState::Dead, now_ms);
        std::mem::take(&mut self.outbox)
    }

    // ----------------------------------------------------------- OffsetCommit

    /// Kafka's `ClassicGroup.validateOffsetCommit`: whether this member at
    /// this generation may commit offsets now. A stale generation cannot.
    pub fn validate_offset_commit(
        &self,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        generation_id: GenerationId,
        is_transactional: bool,
    ) -> Result<(), GroupError> {
        if self.state == GroupState::Dead {
            return Err(GroupError::CoordinatorNotAvailable);
        }
        // Admin clients and consumers that assign partitions themselves
        // commit with generation -1, which only an empty group accepts.
        if generation_id.0 < 0 && self.state == GroupState::Empty {
            return Ok(());
        }
        if generation_id.0 >= 0 || !member_id.is_unknown() || group_instance_id.is_some() {
            self.validate_member(member_id, group_instance_id)?;
            if generation_id != self.generation_id {
                return Err(GroupError::IllegalGeneration);
            }
        } else if !is_transactional && self.state != GroupState::Empty {
            return Err(GroupError::UnknownMemberId);
        }
        if !is_transactional && self.state == GroupState::CompletingRebalance {
            // The member has the new generation but not its assignment yet.
            return Err(GroupError::RebalanceInProgress);
        }
        Ok(())
    }

    // ---------------------------------------------------------------- helpers

    /// Kafka's `ClassicGroup.validateMember`: a static member's instance id
    /// must map to this member id (else it was replaced: fenced), and the
    /// member must exist.
    fn validate_member(
        &self,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
    ) -> Result<(), GroupError> {
        if let Some(instance_id) = group_instance_id {
            match self.static_members.get(instance_id) {
                None => return Err(GroupError::UnknownMemberId),
                Some(existing) if existing != member_id => {
                    return Err(GroupError::FencedInstanceId)
                }
                Some(_) => {}
            }
        }
        if !self.members.contains_key(member_id) {
            return Err(GroupError::UnknownMemberId);
        }
        Ok(())
    }

    /// Kafka's `ClassicGroup.remove`, which also answers the member's parked
    /// requests with UNKNOWN_MEMBER_ID so the client rejoins (Kafka leaves a
    /// parked SyncGroup of a removed member to time out; answering it keeps
    /// the driver from holding it forever).
    fn remove_member(&mut self, member_id: &MemberId) {
        if let Some(member) = self.members.shift_remove(member_id) {
            if let Some(instance_id) = &member.group_instance_id {
                self.static_members.remove(instance_id);
            }
            if member.awaiting_join {
                self.outbox.joins.push((
                    member_id.clone(),
                    JoinResponse::error(MemberId::unknown(), GroupError::UnknownMemberId),
                ));
            }
            if member.awaiting_sync {
                self.outbox.syncs.push((
                    member_id.clone(),
                    SyncResponse::error(GroupError::UnknownMemberId),
                ));
            }
        }
        if self.is_leader(member_id) {
            self.leader_id = self.members.keys().next().cloned();
        }
        self.pending_join_members.shift_remove(member_id);
        self.pending_sync_members.remove(member_id);
    }

    fn transition_to(&mut self, state: GroupState, now_ms: i64) {
        debug_assert!(
            state.can_follow(self.state),
            "group {}: invalid transition {} -> {}",
            self.group_id,
            self.state,
            state
        );
        self.previous_state = self.state;
        self.state = state;
        self.state_timestamp_ms = now_ms;
    }

    fn is_leader(&self, member_id: &MemberId) -> bool {
        self.leader_id.as_ref() == Some(member_id)
    }

    fn leader_or_unknown(&self) -> MemberId {
        self.leader_id.clone().unwrap_or_default()
    }

    /// The invariants the state machine keeps; checked after every step of
    /// the randomized tests.
    #[cfg(test)]
    pub(super) fn assert_invariants(&self) {
        assert_eq!(
            self.leader_id.is_some(),
            !self.members.is_empty(),
            "a group has a leader exactly when it has members"
        );
        if let Some(leader) = &self.leader_id {
            assert!(
                self.members.contains_key(leader),
                "leader {leader} is a member"
            );
        }
        for (instance_id, member_id) in &self.static_members {
            let member = &self.members[member_id];
            assert_eq!(member.group_instance_id.as_ref(), Some(instance_id));
        }
        for member in self.members.values() {
            if let Some(instance_id) = &member.group_instance_id {
                assert_eq!(
                    self.static_members.get(instance_id),
                    Some(&member.member_id)
                );
            }
            if member.awaiting_join {
                assert_eq!(self.state, GroupState::PreparingRebalance);
            }
            if member.awaiting_sync {
                assert_eq!(self.state, GroupState::CompletingRebalance);
            }
            // Every member is watched: by its session, or by the timer of
            // the phase its parked request waits for.
            assert!(
                member.heartbeat_deadline_ms.is_some()
                    || (member.awaiting_join && self.join_timer.is_some())
                    || member.awaiting_sync,
                "member {} is watched by no timer in {}",
                member.member_id,
                self.state
            );
        }
        for member_id in &self.pending_sync_members {
            assert!(self.members.contains_key(member_id));
        }
        match self.state {
            GroupState::Empty | GroupState::Dead => {
                assert!(self.members.is_empty() || self.state == GroupState::Dead)
            }
            GroupState::CompletingRebalance => {
                assert!(!self.members.is_empty(), "{} without members", self.state);
                assert!(
                    self.sync_timer.is_some(),
                    "waiting for the leader's assignment always has a deadline"
                );
            }
            GroupState::Stable => {
                assert!(!self.members.is_empty(), "{} without members", self.state)
            }
            GroupState::PreparingRebalance => assert!(
                self.join_timer.is_some(),
                "a rebalance always has a deadline"
            ),
        }
    }

    fn num_awaiting_join(&self) -> usize {
        self.members.values().filter(|m| m.awaiting_join).count()
    }

    fn has_all_members_joined(&self) -> bool {
        self.members.values().all(|m| m.awaiting_join) && self.pending_join_members.is_empty()
    }

    /// The longest rebalance timeout of any member: the group waits for the
    /// slowest.
    fn rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// The member list the leader receives to compute the assignment.
    fn current_members(&self) -> Vec<JoinResponseMember> {
        let protocol_name = self.protocol_name.as_deref();
        self.members
            .values()
            .map(|m| JoinResponseMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                metadata: m.metadata(protocol_name),
            })
            .collect()
    }

    fn current_join_response(
        &self,
        member_id: MemberId,
        members: Vec<JoinResponseMember>,
        leader: MemberId,
        skip_assignment: bool,
    ) -> JoinResponse {
        JoinResponse {
            error: None,
            generation_id: self.generation_id,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader,
            skip_assignment,
            member_id,
            members,
        }
    }
}

/// The checks Kafka's group coordinator service makes before it looks the
/// group up (so a request that fails them creates no group).
pub(super) fn validate_join_request(
    group_id: &str,
    config: &ClassicGroupConfig,
    request: &JoinRequest,
) -> Result<(), GroupError> {
    if group_id.is_empty() {
        return Err(GroupError::InvalidGroupId);
    }
    if request.session_timeout_ms < config.min_session_timeout_ms
        || request.session_timeout_ms > config.max_session_timeout_ms
    {
        return Err(GroupError::InvalidSessionTimeout);
    }
    Ok(())
}

/// Kafka's member id: the instance id for static members (so operators can
/// tell which instance holds it), the client id otherwise, then a UUID.
fn generate_member_id(client_id: &str, group_instance_id: Option<&GroupInstanceId>) -> MemberId {
    let prefix = group_instance_id.map_or(client_id, |id| id.0.as_str());
    MemberId(format!("{prefix}-{}", uuid::Uuid::new_v4()))
}

/// A request's protocol type or name, when given, must be the group's.
fn is_protocol_inconsistent(requested: Option<&str>, group: Option<&str>) -> bool {
    matches!((requested, group), (Some(r), Some(g)) if r != g)
}
