//! Consumer groups: the classic group protocol (JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup) as a synchronous state machine.
//!
//! Modelled on Apache Kafka's group coordinator (`ClassicGroup` and the
//! classic half of `GroupMetadataManager`). The logic is sans-io: every input
//! is a plain struct plus `now_ms`, and JoinGroup/SyncGroup responses that
//! Kafka parks until the rebalance completes come back as [`Completions`],
//! keyed by member id, from whichever call (or [`ClassicGroup::tick`]) made
//! them ready. An async driver keeps the parked requests, sleeps until
//! [`ClassicGroup::next_deadline_ms`] and calls `tick`.
//!
//! The driver's side of the contract, per call:
//! 1. keep the call's own reply: answer `Reply::Now` at once, or park the
//!    request under the member id of `Reply::Parked` (replacing any request
//!    parked under that id before);
//! 2. if `completed.group_metadata_changed`, store
//!    [`ClassicGroup::group_metadata`] before answering anything;
//! 3. answer the parked requests named in `completed`;
//! 4. call `tick` again no later than `next_deadline_ms`.
//!
//! Wire mapping: JoinGroup v4+ sets `requires_known_member_id`, v9+
//! `supports_skip_assignment`; v0 has no rebalance timeout (pass -1).
//!
//! Invariant: this module knows nothing about sockets, tokio, wall clocks or
//! the wire types of `kafka-protocol`; a thin adapter maps those.

mod classic;
pub mod consumer;
mod coordinator;
pub mod offsets;
pub mod records;

#[cfg(test)]
mod offsets_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod txn_offsets_tests;

use std::borrow::Borrow;
use std::fmt;

use bytes::Bytes;
use kafka_protocol::ResponseError;

pub use classic::{ClassicGroup, MemberView};
pub use coordinator::GroupCoordinator;
pub use offsets::{
    partition_for, GroupExpiryState, OffsetAndMetadata, OffsetExpiration, OffsetStore,
};
pub use records::{CoordinatorRecord, RecordFormatError};

/// A member id handed out by the coordinator: `client_id` (or, for static
/// members, `group.instance.id`) + "-" + a UUID. The empty id is Kafka's
/// `UNKNOWN_MEMBER_ID`: a member that has not been given one yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(pub String);

impl MemberId {
    /// Kafka's `JoinGroupRequest.UNKNOWN_MEMBER_ID`.
    pub fn unknown() -> Self {
        MemberId(String::new())
    }

    pub fn is_unknown(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for MemberId {
    fn from(s: &str) -> Self {
        MemberId(s.to_string())
    }
}

impl Borrow<str> for MemberId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A static member's `group.instance.id`, stable across restarts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupInstanceId(pub String);

impl From<&str> for GroupInstanceId {
    fn from(s: &str) -> Self {
        GroupInstanceId(s.to_string())
    }
}

impl Borrow<str> for GroupInstanceId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupInstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A group's generation; bumped each time a rebalance completes its join
/// phase. Kafka's responses carry -1 when there is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GenerationId(pub i32);

impl GenerationId {
    /// What Kafka puts in a JoinGroup response that carries an error.
    pub const UNKNOWN: GenerationId = GenerationId(-1);
}

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The states of a classic group, with Kafka's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupState {
    /// No members. Offsets may still be committed by admin clients.
    Empty,
    /// Waiting for members to (re)join; JoinGroup responses are parked.
    PreparingRebalance,
    /// The join phase is done; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assignment handed out; members heartbeat.
    Stable,
    /// Deleted or unloaded; every request is turned away.
    Dead,
}

impl GroupState {
    /// The name Kafka reports in DescribeGroups and ListGroups.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }

    /// Kafka's `ClassicGroupState.validPreviousStates`.
    fn can_follow(self, previous: GroupState) -> bool {
        use GroupState::*;
        match self {
            Empty => previous == PreparingRebalance,
            PreparingRebalance => matches!(previous, Stable | CompletingRebalance | Empty),
            CompletingRebalance => previous == PreparingRebalance,
            Stable => previous == CompletingRebalance,
            Dead => true,
        }
    }
}

impl fmt::Display for GroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a group request was turned away, named after the condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("the group is dead (deleted or moved); find the coordinator again")]
    CoordinatorNotAvailable,
    #[error("this broker no longer coordinates the group")]
    NotCoordinator,
    #[error("the member id is not (or no longer) in the group")]
    UnknownMemberId,
    #[error("a first JoinGroup must be retried with the member id in this response")]
    MemberIdRequired,
    #[error("another member with the same group.instance.id has replaced this one")]
    FencedInstanceId,
    #[error("the generation is not the group's current generation")]
    IllegalGeneration,
    #[error("the group is rebalancing; rejoin")]
    RebalanceInProgress,
    #[error("the protocol type or protocols do not match the group's")]
    InconsistentGroupProtocol,
    #[error("the group has reached group.max.size members")]
    GroupMaxSizeReached,
    #[error("the session timeout is outside the broker's allowed range")]
    InvalidSessionTimeout,
    #[error("the group id is empty")]
    InvalidGroupId,
    #[error("the group still has members")]
    NonEmptyGroup,
    #[error("the group does not exist")]
    GroupIdNotFound,
    #[error("the member epoch is fenced; the member must abandon its partitions and rejoin")]
    FencedMemberEpoch,
    #[error("the group.instance.id is still used by a member that has not left")]
    UnreleasedInstanceId,
    #[error("the server assignor is not one of group.consumer.assignors")]
    UnsupportedAssignor,
    #[error("the member epoch is not the member's current epoch")]
    StaleMemberEpoch,
    #[error("the request's fields do not go together")]
    InvalidRequest,
    #[error("members of a consumer-protocol group must commit with OffsetCommit v9+")]
    UnsupportedVersion,
    #[error("the group's members are subscribed to this topic")]
    GroupSubscribedToTopic,
    #[error("the subscribed topic regex is not a valid regular expression")]
    InvalidRegularExpression,
}

impl GroupError {
    /// The one mapping to Kafka error codes.
    pub fn code(self) -> i16 {
        let e = match self {
            GroupError::CoordinatorNotAvailable => ResponseError::CoordinatorNotAvailable,
            GroupError::NotCoordinator => ResponseError::NotCoordinator,
            GroupError::UnknownMemberId => ResponseError::UnknownMemberId,
            GroupError::MemberIdRequired => ResponseError::MemberIdRequired,
            GroupError::FencedInstanceId => ResponseError::FencedInstanceId,
            GroupError::IllegalGeneration => ResponseError::IllegalGeneration,
            GroupError::RebalanceInProgress => ResponseError::RebalanceInProgress,
            GroupError::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
            GroupError::GroupMaxSizeReached => ResponseError::GroupMaxSizeReached,
            GroupError::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
            GroupError::InvalidGroupId => ResponseError::InvalidGroupId,
            GroupError::NonEmptyGroup => ResponseError::NonEmptyGroup,
            GroupError::GroupIdNotFound => ResponseError::GroupIdNotFound,
            GroupError::FencedMemberEpoch => ResponseError::FencedMemberEpoch,
            GroupError::UnreleasedInstanceId => ResponseError::UnreleasedInstanceId,
            GroupError::UnsupportedAssignor => ResponseError::UnsupportedAssignor,
            GroupError::StaleMemberEpoch => ResponseError::StaleMemberEpoch,
            GroupError::InvalidRequest => ResponseError::InvalidRequest,
            GroupError::UnsupportedVersion => ResponseError::UnsupportedVersion,
            GroupError::GroupSubscribedToTopic => ResponseError::GroupSubscribedToTopic,
            GroupError::InvalidRegularExpression => ResponseError::InvalidRegularExpression,
        };
        e.code()
    }
}

/// `0` when there is no error, otherwise the error's Kafka code.
pub fn error_code(error: Option<GroupError>) -> i16 {
    error.map_or(0, GroupError::code)
}

/// The broker settings that shape classic groups, with Kafka's names and
/// defaults (`group.*` in `server.properties`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassicGroupConfig {
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an
    /// empty group waits for more members, extended while members keep
    /// joining, up to the rebalance timeout.
    pub initial_rebalance_delay_ms: i64,
    /// `group.min.session.timeout.ms`.
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub max_session_timeout_ms: i32,
    /// `group.max.size`.
    pub max_size: usize,
    /// How long a new member's parked JoinGroup may wait before it is dropped
    /// (Kafka's fixed 5 minutes): a new member cannot heartbeat, so without
    /// this a client that gave up would linger in every rebalance.
    pub new_member_join_timeout_ms: i64,
}

impl Default for ClassicGroupConfig {
    fn default() -> Self {
        ClassicGroupConfig {
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            max_size: i32::MAX as usize,
            new_member_join_timeout_ms: 5 * 60 * 1_000,
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClassicGroupConfigError {
    #[error("group.initial.rebalance.delay.ms must be >= 0, got {0}")]
    NegativeInitialRebalanceDelay(i64),
    #[error("group.min.session.timeout.ms {min} exceeds group.max.session.timeout.ms {max}")]
    SessionTimeoutRange { min: i32, max: i32 },
    #[error("group.max.size must be >= 1")]
    ZeroMaxSize,
    #[error("the new member join timeout must be > 0, got {0}")]
    NonPositiveNewMemberJoinTimeout(i64),
}

impl ClassicGroupConfig {
    pub fn validate(&self) -> Result<(), ClassicGroupConfigError> {
        if self.initial_rebalance_delay_ms < 0 {
            return Err(ClassicGroupConfigError::NegativeInitialRebalanceDelay(
                self.initial_rebalance_delay_ms,
            ));
        }
        if self.min_session_timeout_ms > self.max_session_timeout_ms {
            return Err(ClassicGroupConfigError::SessionTimeoutRange {
                min: self.min_session_timeout_ms,
                max: self.max_session_timeout_ms,
            });
        }
        if self.max_size == 0 {
            return Err(ClassicGroupConfigError::ZeroMaxSize);
        }
        if self.new_member_join_timeout_ms <= 0 {
            return Err(ClassicGroupConfigError::NonPositiveNewMemberJoinTimeout(
                self.new_member_join_timeout_ms,
            ));
        }
        Ok(())
    }
}

/// One protocol a member supports (for consumers: an assignor name such as
/// `range` or `cooperative-sticky`) with its opaque subscription metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Bytes,
}

/// A JoinGroup request, in the terms the state machine needs.
#[derive(Clone, Debug)]
pub struct JoinRequest {
    /// Empty ([`MemberId::unknown`]) on a member's first join.
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    /// JoinGroup v0 has none; Kafka then uses the session timeout, and so
    /// does this module for any negative value.
    pub rebalance_timeout_ms: i32,
    /// `consumer` for consumers, `connect` for Kafka Connect workers.
    pub protocol_type: String,
    /// In the member's order of preference.
    pub protocols: Vec<Protocol>,
    /// JoinGroup v4+: a dynamic member's first join is answered with
    /// MEMBER_ID_REQUIRED and a member id to join again with.
    pub requires_known_member_id: bool,
    /// JoinGroup v9+: a static leader rejoining a stable group is told to skip
    /// computing an assignment.
    pub supports_skip_assignment: bool,
}

/// A member as the leader sees it in its JoinGroup response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinResponseMember {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    /// The member's metadata for the selected protocol.
    pub metadata: Bytes,
}

/// A JoinGroup response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinResponse {
    pub error: Option<GroupError>,
    pub generation_id: GenerationId,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's member id; empty when there is none.
    pub leader: MemberId,
    pub skip_assignment: bool,
    pub member_id: MemberId,
    /// Filled for the leader only.
    pub members: Vec<JoinResponseMember>,
}

impl JoinResponse {
    /// A response that carries only an error, as Kafka builds them.
    pub fn error(member_id: MemberId, error: GroupError) -> Self {
        JoinResponse {
            error: Some(error),
            generation_id: GenerationId::UNKNOWN,
            protocol_type: None,
            protocol_name: None,
            leader: MemberId::unknown(),
            skip_assignment: false,
            member_id,
            members: Vec::new(),
        }
    }

    pub fn error_code(&self) -> i16 {
        error_code(self.error)
    }
}

/// A SyncGroup request. The leader sends the assignment; followers send none.
#[derive(Clone, Debug)]
pub struct SyncRequest {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    pub generation_id: GenerationId,
    /// SyncGroup v5+; checked against the group's when present.
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(MemberId, Bytes)>,
}

/// A SyncGroup response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncResponse {
    pub error: Option<GroupError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResponse {
    pub fn error(error: GroupError) -> Self {
        SyncResponse {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }

    pub fn error_code(&self) -> i16 {
        error_code(self.error)
    }
}

/// A Heartbeat request.
#[derive(Clone, Debug)]
pub struct HeartbeatRequest {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    pub generation_id: GenerationId,
}

/// One member named in a LeaveGroup request (v3+ batches them). An admin
/// removes a static member by instance id with an unknown member id.
#[derive(Clone, Debug)]
pub struct LeaveMember {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
}

/// The per-member result of a LeaveGroup request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaveMemberResponse {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    pub error: Option<GroupError>,
}

/// How the state machine answers a JoinGroup or SyncGroup request: at once,
/// or later (the response then arrives in a [`Completions`] under the member
/// id). A new parked request for a member replaces the earlier one, as in
/// Kafka, where the older request simply times out at the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<T> {
    Now(T),
    Parked(MemberId),
}

/// Parked responses that became ready, in the order Kafka completes them.
/// The driver registers the reply of the call first, then delivers these:
/// a call may complete its own request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completions {
    pub joins: Vec<(MemberId, JoinResponse)>,
    pub syncs: Vec<(MemberId, SyncResponse)>,
    /// The group's stored metadata changed (new group, a generation without
    /// members, the leader's assignment, a static member's new id): write
    /// [`ClassicGroup::group_metadata`] to the offsets topic before sending
    /// any response of this call, as Kafka does.
    pub group_metadata_changed: bool,
}

impl Completions {
    pub fn is_empty(&self) -> bool {
        self.joins.is_empty() && self.syncs.is_empty() && !self.group_metadata_changed
    }

    pub fn join_for(&self, member_id: &str) -> Option<&JoinResponse> {
        self.joins
            .iter()
            .find(|(m, _)| m.as_str() == member_id)
            .map(|(_, r)| r)
    }

    pub fn sync_for(&self, member_id: &str) -> Option<&SyncResponse> {
        self.syncs
            .iter()
            .find(|(m, _)| m.as_str() == member_id)
            .map(|(_, r)| r)
    }
}

/// What Kafka stores for a classic group in `__consumer_offsets` (the
/// `GroupMetadataValue` record), enough to restore the group after a
/// restart or a coordinator move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMetadata {
    pub protocol_type: Option<String>,
    pub generation_id: GenerationId,
    pub protocol_name: Option<String>,
    pub leader: Option<MemberId>,
    pub current_state_timestamp_ms: i64,
    pub members: Vec<MemberMetadata>,
}

/// One member in [`GroupMetadata`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberMetadata {
    pub member_id: MemberId,
    pub group_instance_id: Option<GroupInstanceId>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// The member's metadata for the selected protocol.
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// The result of a JoinGroup request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinOutcome {
    pub reply: Reply<JoinResponse>,
    pub completed: Completions,
}

/// The result of a SyncGroup request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    pub reply: Reply<SyncResponse>,
    pub completed: Completions,
}

/// The result of a LeaveGroup request: a group-level error, or one result
/// per member named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaveOutcome {
    pub result: Result<Vec<LeaveMemberResponse>, GroupError>,
    pub completed: Completions,
}
