//! KIP-848 consumer groups ("the new consumer protocol"): server-side
//! assignment driven by ConsumerGroupHeartbeat (API 68) and described by
//! ConsumerGroupDescribe (API 69).
//!
//! Modelled on Apache Kafka 4.x's group coordinator:
//! `GroupMetadataManager.consumerGroupHeartbeat`, `ConsumerGroup`,
//! `ConsumerGroupMember`, `CurrentAssignmentBuilder` and
//! `TargetAssignmentBuilder`. Three epochs drive it:
//! - the group epoch, bumped when membership, a subscription or the
//!   metadata of a subscribed topic changes;
//! - the assignment epoch, the group epoch at which the assignor last
//!   computed the target assignment (on the next heartbeat after a bump);
//! - each member's epoch, which reaches the assignment epoch once the member
//!   has revoked what it must give up. A partition is handed to its new
//!   owner only after the previous owner stopped reporting it
//!   (revoke-before-assign), so no partition is ever owned twice.
//!
//! Sans-io like the classic group: every call takes `now_ms`; the driver
//! calls [`ConsumerGroupCoordinator::tick`] no later than
//! [`ConsumerGroupCoordinator::next_deadline_ms`] to expire sessions and
//! rebalance timeouts.
//!
//! Invariant: this module knows nothing about sockets, clocks or the wire
//! types of `kafka-protocol`; topic metadata comes in through
//! [`TopicsView`].

mod assignor;
pub mod records;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use assignor::MemberSpec;
pub use assignor::ServerAssignor;

use super::{GroupCoordinator, GroupError, GroupInstanceId, GroupState, MemberId};

/// A topic's id (the UUID Kafka gives each topic at creation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicId(pub uuid::Uuid);

impl fmt::Display for TopicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A group epoch or a member epoch; a member's epoch is the group epoch of
/// the assignment it has reconciled to, so both share one type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub i32);

impl Epoch {
    /// A heartbeat with epoch 0 joins (or rejoins) the group.
    pub const JOIN: Epoch = Epoch(0);
    /// A heartbeat with epoch -1 leaves the group.
    pub const LEAVE: Epoch = Epoch(-1);
    /// A static member's heartbeat with epoch -2 leaves for now and keeps
    /// its assignment until its session expires.
    pub const STATIC_LEAVE: Epoch = Epoch(-2);
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Partitions by topic, as ConsumerGroupHeartbeat carries them.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// What the coordinator knows of a topic right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicMetadata {
    pub topic_id: TopicId,
    pub partition_count: i32,
}

/// The cluster's current topics, as the coordinator sees them.
pub trait TopicsView {
    fn topic(&self, name: &str) -> Option<TopicMetadata>;
    /// For ConsumerGroupDescribe, which names the topics of assignments.
    fn topic_name(&self, topic_id: TopicId) -> Option<String>;
    /// The names of every topic, internal ones included, for resolving
    /// regex subscriptions: Kafka's `refreshRegularExpressions` matches every
    /// name in the metadata image (only an authorizer narrows it), so a
    /// regex that names `__consumer_offsets` gets it (franz-go's
    /// Test848RegexBrokerResolves checks exactly that against Kafka).
    fn topic_names(&self) -> Vec<String>;
}

/// Compiles a `SubscribedTopicRegex`. Kafka compiles it with RE2/J and
/// matches topic names with `Matcher.matches()`, which must match the whole
/// name, so the pattern is anchored at both ends. The pattern is first
/// compiled as written, so that the wrapping cannot turn an unbalanced
/// pattern such as `a)|(b` into a valid one. The `regex` crate's size and
/// nesting limits turn a pathological pattern into an error, not a blow-up.
fn compile_subscription_regex(pattern: &str) -> Result<regex::Regex, GroupError> {
    regex::Regex::new(pattern).map_err(|_| GroupError::InvalidRegularExpression)?;
    regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|_| GroupError::InvalidRegularExpression)
}

/// A regex some member subscribes with, and the topics it matched when the
/// group last looked (Kafka's `ResolvedRegularExpression`).
#[derive(Clone, Debug)]
struct ResolvedRegex {
    matcher: regex::Regex,
    topics: BTreeSet<String>,
}

impl ResolvedRegex {
    fn new(matcher: regex::Regex) -> Self {
        ResolvedRegex {
            matcher,
            topics: BTreeSet::new(),
        }
    }

    /// The names among `names` the regex matches whole.
    fn resolve<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        names
            .into_iter()
            .filter(|n| self.matcher.is_match(n))
            .map(str::to_string)
            .collect()
    }
}

/// The broker settings of consumer groups, with Kafka's names and defaults
/// (`group.consumer.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupConfig {
    /// `group.consumer.session.timeout.ms`.
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`.
    pub max_size: usize,
    /// `group.consumer.assignors`; the first is the default.
    pub assignors: Vec<ServerAssignor>,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        ConsumerGroupConfig {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: i32::MAX as usize,
            assignors: vec![ServerAssignor::Uniform, ServerAssignor::Range],
        }
    }
}

/// A consumer group configuration that cannot work.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConsumerGroupConfigError {
    #[error("group.consumer.session.timeout.ms must be > 0, got {0}")]
    NonPositiveSessionTimeout(i32),
    #[error("group.consumer.heartbeat.interval.ms {heartbeat_interval_ms} must be > 0 and below group.consumer.session.timeout.ms {session_timeout_ms}")]
    HeartbeatInterval {
        heartbeat_interval_ms: i32,
        session_timeout_ms: i32,
    },
    #[error("group.consumer.max.size must be >= 1")]
    ZeroMaxSize,
    #[error("group.consumer.assignors must name at least one assignor")]
    NoAssignors,
}

impl ConsumerGroupConfig {
    pub fn validate(&self) -> Result<(), ConsumerGroupConfigError> {
        if self.session_timeout_ms <= 0 {
            return Err(ConsumerGroupConfigError::NonPositiveSessionTimeout(
                self.session_timeout_ms,
            ));
        }
        // Kafka requires the interval to be below the session timeout, or a
        // member that heartbeats as told would expire between heartbeats.
        if self.heartbeat_interval_ms <= 0 || self.heartbeat_interval_ms >= self.session_timeout_ms
        {
            return Err(ConsumerGroupConfigError::HeartbeatInterval {
                heartbeat_interval_ms: self.heartbeat_interval_ms,
                session_timeout_ms: self.session_timeout_ms,
            });
        }
        if self.max_size == 0 {
            return Err(ConsumerGroupConfigError::ZeroMaxSize);
        }
        if self.assignors.is_empty() {
            return Err(ConsumerGroupConfigError::NoAssignors);
        }
        Ok(())
    }

    fn default_assignor(&self) -> ServerAssignor {
        self.assignors
            .first()
            .copied()
            .unwrap_or(ServerAssignor::Uniform)
    }

    fn assignor_named(&self, name: &str) -> Option<ServerAssignor> {
        ServerAssignor::from_name(name).filter(|a| self.assignors.contains(a))
    }
}

/// A ConsumerGroupHeartbeat request (v0-1). `None` fields mean "unchanged
/// since the last heartbeat", as on the wire.
#[derive(Clone, Debug, Default)]
pub struct ConsumerHeartbeat {
    /// v0: empty on the first join, and the coordinator makes one up; v1
    /// clients generate a UUID themselves.
    pub member_id: MemberId,
    pub member_epoch: Epoch,
    pub instance_id: Option<GroupInstanceId>,
    pub rack_id: Option<String>,
    /// -1 when unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    /// v1 (Java's `subscribe(SubscriptionPattern)`): the member also
    /// subscribes to every topic whose whole name matches. `Some("")`
    /// clears the member's regex, as in Kafka.
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member owns right now.
    pub owned_topic_partitions: Option<Assignment>,
    /// The request's API version (0 or 1).
    pub api_version: i16,
    /// From the request header.
    pub client_id: String,
    /// The client's address, as Kafka reports it in describe.
    pub client_host: String,
}

/// A ConsumerGroupHeartbeat response without error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerHeartbeatReply {
    pub member_id: MemberId,
    pub member_epoch: Epoch,
    /// 0 in the answer to a leave, as in Kafka.
    pub heartbeat_interval_ms: i32,
    /// The partitions the member may use now; `None` when unchanged.
    pub assignment: Option<Assignment>,
}

/// Where a member is in its reconciliation, with Kafka's `MemberState`
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberState {
    /// At the assignment epoch (or waiting for a newer one).
    Stable,
    /// Must revoke partitions before it can move to the next epoch.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions other members still own.
    UnreleasedPartitions,
    /// Kafka's catch-all for a state a newer coordinator wrote; this module
    /// never creates it, but reconciles it as Kafka does.
    Unknown,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
            MemberState::Unknown => "unknown",
        }
    }
}

/// The states of a consumer group, with Kafka's `ConsumerGroupState` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConsumerGroupState {
    Empty,
    /// The group epoch is ahead of the assignment epoch.
    Assigning,
    /// Some member has not reached the assignment epoch yet.
    Reconciling,
    Stable,
    Dead,
}

impl ConsumerGroupState {
    /// The name Kafka reports in ConsumerGroupDescribe and ListGroups.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
            ConsumerGroupState::Dead => "Dead",
        }
    }
}

impl fmt::Display for ConsumerGroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One member of a consumer group (Kafka's `ConsumerGroupMember`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Member {
    member_id: MemberId,
    instance_id: Option<GroupInstanceId>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    rebalance_timeout_ms: i32,
    subscribed_topic_names: BTreeSet<String>,
    /// Never `Some("")`: an empty regex is stored as none.
    subscribed_topic_regex: Option<String>,
    server_assignor: Option<ServerAssignor>,
    member_epoch: Epoch,
    previous_member_epoch: Epoch,
    state: MemberState,
    /// The partitions the member may use (Kafka's `assignedPartitions`).
    assigned: Assignment,
    /// Partitions it was asked to give up and still owns.
    pending_revocation: Assignment,
}

impl Member {
    fn new(member_id: MemberId) -> Self {
        Member {
            member_id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            rebalance_timeout_ms: -1,
            subscribed_topic_names: BTreeSet::new(),
            subscribed_topic_regex: None,
            server_assignor: None,
            member_epoch: Epoch(0),
            previous_member_epoch: Epoch(-1),
            state: MemberState::Stable,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
        }
    }

    fn is_reconciled_to(&self, assignment_epoch: Epoch) -> bool {
        self.state == MemberState::Stable && self.member_epoch == assignment_epoch
    }

    /// Kafka's `Builder.updateMemberEpoch`: the old epoch becomes the
    /// previous one, which a heartbeat whose response was lost may still
    /// carry.
    fn update_member_epoch(&mut self, epoch: Epoch) {
        self.previous_member_epoch = self.member_epoch;
        self.member_epoch = epoch;
    }
}

/// The timers of one member, kept apart from [`Member`] so that comparing
/// members (did the heartbeat change anything?) ignores them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct MemberTimers {
    session_deadline_ms: i64,
    /// The member must have revoked by then, or it is fenced; armed only
    /// while it is in UNREVOKED_PARTITIONS, for the epoch it was asked in.
    rebalance_deadline: Option<(i64, Epoch)>,
}

/// A KIP-848 consumer group (Kafka's `ConsumerGroup`).
#[derive(Clone, Debug)]
pub struct ConsumerGroup {
    group_id: String,
    group_epoch: Epoch,
    assignment_epoch: Epoch,
    members: BTreeMap<MemberId, Member>,
    timers: HashMap<MemberId, MemberTimers>,
    static_members: HashMap<GroupInstanceId, MemberId>,
    target_assignment: BTreeMap<MemberId, Assignment>,
    /// The metadata of the subscribed topics that exist, when the group
    /// epoch was last decided; a difference on a later heartbeat (a topic
    /// created, deleted or grown) bumps the group epoch.
    subscription_metadata: BTreeMap<String, TopicMetadata>,
    /// Every regex some member subscribes with, resolved against the
    /// topics of the last heartbeat (Kafka's `resolvedRegularExpressions`).
    /// Not part of the snapshot: it is rebuilt from the subscription
    /// metadata on restore.
    regexes: BTreeMap<String, ResolvedRegex>,
    /// Kafka's `currentPartitionEpoch`: who owns each partition (assigned or
    /// pending revocation) and at which epoch.
    partition_owners: HashMap<(TopicId, i32), (MemberId, Epoch)>,
    /// The assignor of the last target assignment, for describe.
    assignor: ServerAssignor,
}

/// ConsumerGroupDescribe's view of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupDescription {
    pub group_id: String,
    pub state: ConsumerGroupState,
    pub group_epoch: Epoch,
    pub assignment_epoch: Epoch,
    pub assignor_name: String,
    pub members: Vec<MemberDescription>,
}

/// One member in [`ConsumerGroupDescription`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: MemberId,
    pub instance_id: Option<GroupInstanceId>,
    pub rack_id: Option<String>,
    pub member_epoch: Epoch,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: Vec<DescribedTopicPartitions>,
    pub target_assignment: Vec<DescribedTopicPartitions>,
    /// ConsumerGroupDescribe v1 `MemberType`: 1 (consumer protocol) for
    /// every member here, since classic members cannot join these groups.
    pub member_type: i8,
}

/// Partitions of one topic, named as ConsumerGroupDescribe names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescribedTopicPartitions {
    pub topic_id: TopicId,
    /// Empty when the topic no longer exists.
    pub topic_name: String,
    pub partitions: Vec<i32>,
}

/// Kafka 4.x's `throwIfConsumerGroupHeartbeatRequestIsInvalid`. The regex
/// itself is compiled later, when a member brings a new one (Kafka's
/// `maybeUpdateRegularExpressions`).
pub fn validate_heartbeat(
    group_id: &str,
    req: &ConsumerHeartbeat,
    config: &ConsumerGroupConfig,
) -> Result<(), GroupError> {
    let epoch = req.member_epoch;
    // From v1 the consumer generates its member id (KIP-1082); before, a
    // joining member leaves it empty and the coordinator makes one up.
    if (req.api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
        || epoch.0 > 0
        || epoch == Epoch::LEAVE)
        && req.member_id.is_unknown()
    {
        return Err(GroupError::InvalidRequest);
    }
    let empty = |s: &Option<String>| s.as_deref().is_some_and(str::is_empty);
    if group_id.is_empty()
        || req.instance_id.as_ref().is_some_and(|i| i.0.is_empty())
        || empty(&req.rack_id)
    {
        return Err(GroupError::InvalidRequest);
    }
    if epoch == Epoch::JOIN {
        if req.rebalance_timeout_ms == -1 {
            return Err(GroupError::InvalidRequest);
        }
        if req
            .owned_topic_partitions
            .as_ref()
            .is_none_or(|o| !o.is_empty())
        {
            return Err(GroupError::InvalidRequest);
        }
        // An empty list is accepted: the member is in the group without
        // subscribing to anything.
        let has_regex = req
            .subscribed_topic_regex
            .as_deref()
            .is_some_and(|r| !r.is_empty());
        if req.subscribed_topic_names.is_none() && !has_regex {
            return Err(GroupError::InvalidRequest);
        }
    } else if epoch == Epoch::STATIC_LEAVE {
        if req.instance_id.is_none() {
            return Err(GroupError::InvalidRequest);
        }
    } else if epoch < Epoch::STATIC_LEAVE {
        return Err(GroupError::InvalidRequest);
    }
    if let Some(name) = &req.server_assignor {
        if config.assignor_named(name).is_none() {
            return Err(GroupError::UnsupportedAssignor);
        }
    }
    Ok(())
}

/// Kafka's `ConsumerGroupHeartbeatRequest.CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION`.
pub const CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION: i16 = 1;

/// Kafka's `isSubset`: the member owns nothing outside `target`. A request
/// that does not report its partitions is not a subset, and neither is one
/// that names a topic outside `target`, even with no partitions.
fn is_subset(owned: Option<&Assignment>, target: &Assignment) -> bool {
    let Some(owned) = owned else { return false };
    owned.iter().all(|(topic_id, partitions)| {
        target
            .get(topic_id)
            .is_some_and(|t| partitions.iter().all(|p| t.contains(p)))
    })
}

/// Kafka's `throwIfConsumerGroupMemberEpochIsInvalid`, with KAFKA-19233
/// (Kafka 4.2): epoch 0 always passes, so that a fenced member can rejoin
/// under its own member id.
fn validate_member_epoch(
    member: &Member,
    received: Epoch,
    owned: Option<&Assignment>,
) -> Result<(), GroupError> {
    if received == Epoch::JOIN {
        return Ok(());
    }
    if received > member.member_epoch {
        return Err(GroupError::FencedMemberEpoch);
    }
    // A member one epoch behind whose partitions are a subset of its
    // assignment lost the response that moved it on; Kafka accepts it.
    if received < member.member_epoch
        && (received != member.previous_member_epoch || !is_subset(owned, &member.assigned))
    {
        return Err(GroupError::FencedMemberEpoch);
    }
    Ok(())
}

fn assignment_without(assignment: &Assignment, remove: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic_id, partitions) in assignment {
        let rest: BTreeSet<i32> = match remove.get(topic_id) {
            Some(r) => partitions.difference(r).copied().collect(),
            None => partitions.clone(),
        };
        if !rest.is_empty() {
            out.insert(*topic_id, rest);
        }
    }
    out
}

fn assignment_intersection(a: &Assignment, b: &Assignment) -> Assignment {
    let mut out = Assignment::new();
    for (topic_id, partitions) in a {
        if let Some(other) = b.get(topic_id) {
            let both: BTreeSet<i32> = partitions.intersection(other).copied().collect();
            if !both.is_empty() {
                out.insert(*topic_id, both);
            }
        }
    }
    out
}

/// Does the member still report any of `revoking` as owned? A request
/// without owned partitions says nothing, and Kafka then assumes it does.
fn owns_any(owned: Option<&Assignment>, revoking: &Assignment) -> bool {
    let Some(owned) = owned else { return true };
    owned.iter().any(|(topic_id, partitions)| {
        revoking
            .get(topic_id)
            .is_some_and(|r| partitions.iter().any(|p| r.contains(p)))
    })
}

impl ConsumerGroup {
    pub fn new(group_id: impl Into<String>, default_assignor: ServerAssignor) -> Self {
        ConsumerGroup {
            group_id: group_id.into(),
            group_epoch: Epoch(0),
            assignment_epoch: Epoch(0),
            members: BTreeMap::new(),
            timers: HashMap::new(),
            static_members: HashMap::new(),
            target_assignment: BTreeMap::new(),
            subscription_metadata: BTreeMap::new(),
            regexes: BTreeMap::new(),
            partition_owners: HashMap::new(),
            assignor: default_assignor,
        }
    }

    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    pub fn group_epoch(&self) -> Epoch {
        self.group_epoch
    }

    pub fn assignment_epoch(&self) -> Epoch {
        self.assignment_epoch
    }

    pub fn num_members(&self) -> usize {
        self.members.len()
    }

    /// Every topic some member subscribes to (offset expiry spares these).
    pub fn subscribed_topics(&self) -> BTreeSet<String> {
        self.subscribed_topic_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    pub fn has_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    /// Kafka's `maybeUpdateGroupState`, computed on demand.
    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| !m.is_reconciled_to(self.assignment_epoch))
        {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    /// A member's epoch and the partitions it may use, if it is a member.
    pub fn member_assignment(&self, member_id: &str) -> Option<(Epoch, &Assignment)> {
        self.members
            .get(member_id)
            .map(|m| (m.member_epoch, &m.assigned))
    }

    /// A member's reconciliation state, if it is a member.
    pub fn member_state(&self, member_id: &str) -> Option<MemberState> {
        self.members.get(member_id).map(|m| m.state)
    }

    /// The partitions a member owns: assigned or still pending revocation.
    pub fn owned_partitions(&self, member_id: &str) -> Option<Assignment> {
        self.members.get(member_id).map(|m| {
            let mut owned = m.assigned.clone();
            for (topic_id, partitions) in &m.pending_revocation {
                owned.entry(*topic_id).or_default().extend(partitions);
            }
            owned
        })
    }

    /// The member's target assignment at the assignment epoch.
    pub fn target_assignment(&self, member_id: &str) -> Option<&Assignment> {
        self.target_assignment.get(member_id)
    }

    /// The member id the static member `instance_id` has now.
    pub fn static_member_id(&self, instance_id: &str) -> Option<&MemberId> {
        self.static_members.get(instance_id)
    }

    /// The current owner of a partition, as revoke-before-assign sees it.
    pub fn partition_owner(&self, topic_id: TopicId, partition: i32) -> Option<&MemberId> {
        self.partition_owners
            .get(&(topic_id, partition))
            .map(|(m, _)| m)
    }

    /// Every topic some member subscribes to, by name or through its regex.
    fn subscribed_topic_names(&self) -> BTreeSet<&str> {
        self.members
            .values()
            .flat_map(|m| self.member_topic_names(m))
            .collect()
    }

    /// A member's subscription: its topic names and the topics its regex
    /// resolved to (Kafka's `TargetAssignmentBuilder` takes the union).
    fn member_topic_names<'a>(&'a self, member: &'a Member) -> impl Iterator<Item = &'a str> {
        let resolved = member
            .subscribed_topic_regex
            .as_ref()
            .and_then(|r| self.regexes.get(r))
            .into_iter()
            .flat_map(|r| r.topics.iter());
        member
            .subscribed_topic_names
            .iter()
            .chain(resolved)
            .map(String::as_str)
    }

    /// Forgets the regexes no member subscribes with any more.
    fn prune_regexes(&mut self) {
        let used: BTreeSet<&String> = self
            .members
            .values()
            .filter_map(|m| m.subscribed_topic_regex.as_ref())
            .collect();
        self.regexes.retain(|r, _| used.contains(r));
    }

    /// Resolves every regex of the group against the current topics;
    /// returns whether any resolution changed. Kafka resolves in the
    /// background, at most every 10 s and when topics were created; here it
    /// happens on every heartbeat of a group that has regexes, which sees
    /// the same changes sooner.
    fn refresh_regexes(&mut self, topics: &dyn TopicsView) -> bool {
        self.prune_regexes();
        if self.regexes.is_empty() {
            return false;
        }
        let names = topics.topic_names();
        let mut changed = false;
        for resolved in self.regexes.values_mut() {
            let now = resolved.resolve(names.iter().map(String::as_str));
            if now != resolved.topics {
                resolved.topics = now;
                changed = true;
            }
        }
        changed
    }

    fn compute_subscription_metadata<'a>(
        names: impl IntoIterator<Item = &'a str>,
        topics: &dyn TopicsView,
    ) -> BTreeMap<String, TopicMetadata> {
        names
            .into_iter()
            .filter_map(|name| topics.topic(name).map(|t| (name.to_string(), t)))
            .collect()
    }

    /// Kafka's `computePreferredServerAssignor`: the assignor most members
    /// ask for; ties go to the earlier one in `group.consumer.assignors`,
    /// and without any request the first one is used.
    fn preferred_assignor(&self, config: &ConsumerGroupConfig) -> ServerAssignor {
        let mut counts: Vec<(ServerAssignor, usize)> =
            config.assignors.iter().map(|&a| (a, 0)).collect();
        for member in self.members.values() {
            if let Some(a) = member.server_assignor {
                if let Some(entry) = counts.iter_mut().find(|(x, _)| *x == a) {
                    entry.1 += 1;
                }
            }
        }
        let best = counts.iter().map(|(_, c)| *c).max().unwrap_or(0);
        if best == 0 {
            return config.default_assignor();
        }
        counts
            .iter()
            .find(|(_, c)| *c == best)
            .map_or(config.default_assignor(), |(a, _)| *a)
    }

    /// Puts a member in place of its previous version, keeping the
    /// ownership index right (Kafka's `updateMember`).
    fn put_member(&mut self, member: Member) {
        if let Some(old) = self.members.get(&member.member_id) {
            let old_owned: Vec<(TopicId, i32)> = old
                .assigned
                .iter()
                .chain(old.pending_revocation.iter())
                .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
                .collect();
            for tp in old_owned {
                self.partition_owners.remove(&tp);
            }
        }
        for (topic_id, partitions) in member.assigned.iter().chain(&member.pending_revocation) {
            for &p in partitions {
                let previous = self.partition_owners.insert(
                    (*topic_id, p),
                    (member.member_id.clone(), member.member_epoch),
                );
                // Kafka throws IllegalStateException here: revoke-before-
                // assign guarantees it cannot happen.
                debug_assert!(
                    previous
                        .as_ref()
                        .is_none_or(|(m, _)| *m == member.member_id),
                    "partition {topic_id}-{p} given to {} while {previous:?} owns it",
                    member.member_id
                );
            }
        }
        if let Some(instance_id) = &member.instance_id {
            self.static_members
                .insert(instance_id.clone(), member.member_id.clone());
        }
        self.members.insert(member.member_id.clone(), member);
    }

    /// Removes a member and everything it owns (Kafka's `removeMember` plus
    /// the target assignment tombstone).
    fn drop_member(&mut self, member_id: &MemberId) -> Option<Member> {
        let member = self.members.remove(member_id)?;
        for (topic_id, partitions) in member.assigned.iter().chain(&member.pending_revocation) {
            for &p in partitions {
                if self
                    .partition_owners
                    .get(&(*topic_id, p))
                    .is_some_and(|(m, _)| m == member_id)
                {
                    self.partition_owners.remove(&(*topic_id, p));
                }
            }
        }
        if let Some(instance_id) = &member.instance_id {
            if self.static_members.get(instance_id) == Some(member_id) {
                self.static_members.remove(instance_id);
            }
        }
        self.target_assignment.remove(member_id);
        self.timers.remove(member_id);
        Some(member)
    }

    /// Kafka's `consumerGroupFenceMember`: the member is removed and the
    /// group epoch bumped, so the next heartbeat computes a new target
    /// assignment without it. The subscription metadata keeps only the
    /// topics someone still subscribes to.
    fn fence_member(&mut self, member_id: &MemberId) {
        if self.drop_member(member_id).is_none() {
            return;
        }
        self.prune_regexes();
        let names: BTreeSet<String> = self
            .subscribed_topic_names()
            .into_iter()
            .map(str::to_string)
            .collect();
        self.subscription_metadata
            .retain(|name, _| names.contains(name));
        self.group_epoch = Epoch(self.group_epoch.0 + 1);
    }

    fn heartbeat(
        &mut self,
        req: ConsumerHeartbeat,
        topics: &dyn TopicsView,
        config: &ConsumerGroupConfig,
        now_ms: i64,
    ) -> Result<ConsumerHeartbeatReply, GroupError> {
        if req.member_epoch == Epoch::LEAVE || req.member_epoch == Epoch::STATIC_LEAVE {
            return self.leave(&req);
        }
        let joining = req.member_epoch == Epoch::JOIN;
        // Kafka's `throwIfConsumerGroupIsFull`: a member already in the
        // group may always heartbeat; anyone else is turned away at the cap
        // (a static member replacing a departed one included, as in Kafka).
        if self.members.len() >= config.max_size
            && (req.member_id.is_unknown() || !self.members.contains_key(&req.member_id))
        {
            return Err(GroupError::GroupMaxSizeReached);
        }
        let member_id = if req.member_id.is_unknown() {
            MemberId(uuid::Uuid::new_v4().to_string())
        } else {
            req.member_id.clone()
        };
        let owned = req.owned_topic_partitions.as_ref();

        // The member as it is, or as a fresh one; for a static member that
        // replaces its departed self, a copy of the departed member under
        // the new id (it keeps its assignment).
        let mut replaced: Option<MemberId> = None;
        let member: Member = match &req.instance_id {
            None => match self.members.get(&member_id) {
                Some(m) => {
                    validate_member_epoch(m, req.member_epoch, owned)?;
                    m.clone()
                }
                None if joining => Member::new(member_id.clone()),
                None => return Err(GroupError::UnknownMemberId),
            },
            Some(instance_id) => {
                let existing = self
                    .static_members
                    .get(instance_id)
                    .and_then(|id| self.members.get(id));
                if joining {
                    match existing {
                        None => match self.members.get(&member_id) {
                            Some(m) => m.clone(),
                            None => Member::new(member_id.clone()),
                        },
                        Some(old) => {
                            if old.member_epoch != Epoch::STATIC_LEAVE {
                                return Err(GroupError::UnreleasedInstanceId);
                            }
                            let mut m = old.clone();
                            if old.member_id != member_id {
                                replaced = Some(old.member_id.clone());
                            }
                            m.member_id = member_id.clone();
                            m.member_epoch = Epoch(0);
                            m.previous_member_epoch = Epoch(0);
                            m
                        }
                    }
                } else {
                    let old = existing.ok_or(GroupError::UnknownMemberId)?;
                    if old.member_id != member_id {
                        return Err(GroupError::FencedInstanceId);
                    }
                    validate_member_epoch(old, req.member_epoch, owned)?;
                    old.clone()
                }
            }
        };

        // 1. Update the member; a new subscription bumps the group epoch.
        let mut updated = member.clone();
        if let Some(instance_id) = &req.instance_id {
            updated.instance_id = Some(instance_id.clone());
        }
        if let Some(rack_id) = &req.rack_id {
            updated.rack_id = Some(rack_id.clone());
        }
        if req.rebalance_timeout_ms != -1 {
            updated.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(name) = &req.server_assignor {
            updated.server_assignor = config.assignor_named(name);
        }
        if let Some(names) = &req.subscribed_topic_names {
            updated.subscribed_topic_names = names.iter().cloned().collect();
        }
        if let Some(regex) = &req.subscribed_topic_regex {
            updated.subscribed_topic_regex = Some(regex.clone()).filter(|r| !r.is_empty());
        }
        let regex_changed = updated.subscribed_topic_regex != member.subscribed_topic_regex;
        if regex_changed {
            // A regex new to the group is compiled before anything changes,
            // so an invalid one leaves the group as it was (Kafka's
            // `throwIfRegularExpressionIsInvalid`).
            if let Some(regex) = &updated.subscribed_topic_regex {
                if !self.regexes.contains_key(regex) {
                    let matcher = compile_subscription_regex(regex)?;
                    self.regexes
                        .insert(regex.clone(), ResolvedRegex::new(matcher));
                }
            }
        }
        updated.client_id = req.client_id.clone();
        updated.client_host = req.client_host.clone();
        // A new group moves away from epoch 0 on its first heartbeat even if
        // the member subscribes to nothing (Kafka 4.x).
        let mut bump_group_epoch = self.group_epoch == Epoch(0)
            || updated.subscribed_topic_names != member.subscribed_topic_names
            || regex_changed;

        if let Some(old_id) = &replaced {
            // The departed static member leaves without an epoch bump: the
            // new one takes over its target assignment.
            let target = self.target_assignment.get(old_id).cloned();
            self.drop_member(old_id);
            if let Some(target) = target {
                self.target_assignment.insert(member_id.clone(), target);
            }
        }
        self.put_member(updated.clone());

        // A regex that now matches other topics changes the subscription
        // (Kafka bumps the epoch when a refresh resolved differently).
        if self.refresh_regexes(topics) {
            bump_group_epoch = true;
        }

        // Kafka refreshes the subscription metadata when a subscription
        // changed or the metadata image did; comparing on every heartbeat
        // notices the same changes (a topic created, deleted or grown).
        let metadata = Self::compute_subscription_metadata(self.subscribed_topic_names(), topics);
        if metadata != self.subscription_metadata {
            self.subscription_metadata = metadata;
            bump_group_epoch = true;
        }
        if bump_group_epoch {
            self.group_epoch = Epoch(self.group_epoch.0 + 1);
        }

        // 2. A new target assignment at the group epoch, if there is none.
        if self.group_epoch > self.assignment_epoch {
            self.compute_target_assignment(config);
        }

        // 3. Move the member towards its target.
        let mut reconciled = updated.clone();
        if !reconciled.is_reconciled_to(self.assignment_epoch) {
            let target = self
                .target_assignment
                .get(&member_id)
                .cloned()
                .unwrap_or_default();
            reconciled = self.next_member_state(&updated, self.assignment_epoch, &target, owned)?;
            if reconciled != updated {
                self.put_member(reconciled.clone());
                let timers = self.timers.entry(member_id.clone()).or_default();
                timers.rebalance_deadline = if reconciled.state == MemberState::UnrevokedPartitions
                {
                    Some((
                        now_ms.saturating_add(i64::from(reconciled.rebalance_timeout_ms.max(0))),
                        reconciled.member_epoch,
                    ))
                } else {
                    None
                };
            }
        }
        self.timers
            .entry(member_id.clone())
            .or_default()
            .session_deadline_ms = now_ms.saturating_add(i64::from(config.session_timeout_ms));

        // The assignment goes back on a full request (a join, or one that
        // carries every field, as clients send after an error) or when it
        // changed.
        let full_request = joining
            || (req.rebalance_timeout_ms != -1
                && (req.subscribed_topic_names.is_some() || req.subscribed_topic_regex.is_some())
                && req.owned_topic_partitions.is_some());
        let assignment = if full_request || reconciled.assigned != member.assigned {
            Some(reconciled.assigned.clone())
        } else {
            None
        };
        Ok(ConsumerHeartbeatReply {
            member_id,
            member_epoch: reconciled.member_epoch,
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            assignment,
        })
    }

    /// Kafka's `consumerGroupLeave`.
    fn leave(&mut self, req: &ConsumerHeartbeat) -> Result<ConsumerHeartbeatReply, GroupError> {
        let member_id = match &req.instance_id {
            None => {
                if !self.members.contains_key(&req.member_id) {
                    return Err(GroupError::UnknownMemberId);
                }
                req.member_id.clone()
            }
            Some(instance_id) => {
                let existing = self
                    .static_members
                    .get(instance_id)
                    .cloned()
                    .ok_or(GroupError::UnknownMemberId)?;
                if existing != req.member_id {
                    return Err(GroupError::FencedInstanceId);
                }
                existing
            }
        };
        if req.member_epoch == Epoch::STATIC_LEAVE && req.instance_id.is_some() {
            // The static member is expected back: it keeps its assignment
            // (its partitions stay owned, at epoch -2) and its session timer
            // keeps running, so it is removed only if it does not return
            // within the session timeout. The group epoch does not move.
            if let Some(member) = self.members.get(&member_id) {
                let mut leaving = member.clone();
                leaving.member_epoch = Epoch::STATIC_LEAVE;
                leaving.pending_revocation.clear();
                self.put_member(leaving);
            }
            if let Some(timers) = self.timers.get_mut(&member_id) {
                timers.rebalance_deadline = None;
            }
        } else {
            self.fence_member(&member_id);
        }
        Ok(ConsumerHeartbeatReply {
            member_id,
            member_epoch: req.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// Kafka's `TargetAssignmentBuilder`: the group's assignor over every
    /// member (departed static members included), at the group epoch.
    fn compute_target_assignment(&mut self, config: &ConsumerGroupConfig) {
        let assignor = self.preferred_assignor(config);
        let partition_counts: BTreeMap<TopicId, i32> = self
            .subscription_metadata
            .values()
            .map(|t| (t.topic_id, t.partition_count))
            .collect();
        let specs: Vec<MemberSpec> = self
            .members
            .values()
            .map(|m| MemberSpec {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                subscribed_topic_ids: self
                    .member_topic_names(m)
                    .filter_map(|name| self.subscription_metadata.get(name))
                    .map(|t| t.topic_id)
                    .collect(),
                previous: self
                    .target_assignment
                    .get(&m.member_id)
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect();
        self.target_assignment = assignor.assign(&specs, &partition_counts);
        self.assignment_epoch = self.group_epoch;
        self.assignor = assignor;
    }

    /// Kafka's `CurrentAssignmentBuilder.build`.
    fn next_member_state(
        &self,
        member: &Member,
        target_epoch: Epoch,
        target: &Assignment,
        owned: Option<&Assignment>,
    ) -> Result<Member, GroupError> {
        match member.state {
            MemberState::Stable => {
                if member.member_epoch != target_epoch {
                    Ok(self.compute_next_assignment(
                        member,
                        member.member_epoch,
                        target_epoch,
                        target,
                        owned,
                    ))
                } else {
                    Ok(member.clone())
                }
            }
            MemberState::UnrevokedPartitions => {
                // The member moves on only once it stopped reporting every
                // partition it was asked to revoke.
                if owns_any(owned, &member.pending_revocation) {
                    return Ok(member.clone());
                }
                Ok(self.compute_next_assignment(
                    member,
                    Epoch(member.member_epoch.0 + 1),
                    target_epoch,
                    target,
                    owned,
                ))
            }
            MemberState::UnreleasedPartitions => Ok(self.compute_next_assignment(
                member,
                member.member_epoch,
                target_epoch,
                target,
                owned,
            )),
            MemberState::Unknown => {
                if owned.is_none_or(|o| !o.is_empty()) {
                    return Err(GroupError::FencedMemberEpoch);
                }
                Ok(self.compute_next_assignment(member, target_epoch, target_epoch, target, owned))
            }
        }
    }

    /// Kafka's `CurrentAssignmentBuilder.computeNextAssignment`.
    fn compute_next_assignment(
        &self,
        member: &Member,
        member_epoch: Epoch,
        target_epoch: Epoch,
        target: &Assignment,
        owned: Option<&Assignment>,
    ) -> Member {
        // Kept = what it has ∩ target; to revoke = what it has - kept; to
        // assign = target - kept - what someone else still owns.
        let kept = assignment_intersection(&member.assigned, target);
        let revoking = assignment_without(&member.assigned, &kept);
        let mut assigning = Assignment::new();
        let mut has_unreleased = false;
        for (topic_id, partitions) in &assignment_without(target, &kept) {
            for &p in partitions {
                if self.partition_owners.contains_key(&(*topic_id, p)) {
                    has_unreleased = true;
                } else {
                    assigning.entry(*topic_id).or_default().insert(p);
                }
            }
        }
        let mut next = member.clone();
        if !revoking.is_empty() && owns_any(owned, &revoking) {
            // It stays at its epoch and revokes first.
            next.state = MemberState::UnrevokedPartitions;
            next.update_member_epoch(member_epoch);
            next.assigned = kept;
            next.pending_revocation = revoking;
        } else {
            let mut assigned = kept;
            for (topic_id, partitions) in assigning {
                assigned.entry(topic_id).or_default().extend(partitions);
            }
            next.state = if has_unreleased {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
            next.update_member_epoch(target_epoch);
            next.assigned = assigned;
            next.pending_revocation = Assignment::new();
        }
        next
    }

    /// Expires sessions and rebalance timeouts that are due.
    fn tick(&mut self, now_ms: i64) {
        let mut due: Vec<MemberId> = self
            .timers
            .iter()
            .filter(|(member_id, t)| {
                let session_expired = t.session_deadline_ms <= now_ms;
                // Kafka's rebalance timer fences the member only if it is
                // still at the epoch it was asked to revoke in.
                let revoke_expired = t.rebalance_deadline.is_some_and(|(at, epoch)| {
                    at <= now_ms
                        && self
                            .members
                            .get(*member_id)
                            .is_some_and(|m| m.member_epoch == epoch)
                });
                session_expired || revoke_expired
            })
            .map(|(m, _)| m.clone())
            .collect();
        due.sort();
        for member_id in due {
            self.fence_member(&member_id);
        }
        // A due rebalance timer of a member that moved on to another epoch
        // is spent, as Kafka's timer is once it fired and found nothing to
        // fence; left in place it would stay due forever.
        for timers in self.timers.values_mut() {
            if timers
                .rebalance_deadline
                .is_some_and(|(at, _)| at <= now_ms)
            {
                timers.rebalance_deadline = None;
            }
        }
    }

    fn next_deadline_ms(&self) -> Option<i64> {
        self.timers
            .values()
            .flat_map(|t| {
                std::iter::once(t.session_deadline_ms).chain(t.rebalance_deadline.map(|(at, _)| at))
            })
            .min()
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit`.
    fn validate_offset_commit(
        &self,
        member_id: &MemberId,
        member_epoch: Epoch,
        api_version: i16,
        is_transactional: bool,
    ) -> Result<(), GroupError> {
        // An admin client or a consumer that assigns partitions itself
        // commits with epoch -1; it may do so only while the group is empty.
        if member_epoch.0 < 0 && self.members.is_empty() {
            return Ok(());
        }
        let member = self
            .members
            .get(member_id)
            .ok_or(GroupError::UnknownMemberId)?;
        if !is_transactional && api_version < 9 {
            return Err(GroupError::UnsupportedVersion);
        }
        if member_epoch != member.member_epoch {
            return Err(GroupError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// Kafka's `ConsumerGroup.validateOffsetFetch` (OffsetFetch v9+).
    fn validate_offset_fetch(
        &self,
        member_id: Option<&MemberId>,
        member_epoch: Epoch,
    ) -> Result<(), GroupError> {
        let Some(member_id) = member_id else {
            if member_epoch.0 < 0 {
                return Ok(());
            }
            return Err(GroupError::UnknownMemberId);
        };
        let member = self
            .members
            .get(member_id)
            .ok_or(GroupError::UnknownMemberId)?;
        if member_epoch != member.member_epoch {
            return Err(GroupError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// ConsumerGroupDescribe's view of the group.
    pub fn describe(&self, topics: &dyn TopicsView) -> ConsumerGroupDescription {
        let describe = |a: &Assignment| -> Vec<DescribedTopicPartitions> {
            a.iter()
                .map(|(topic_id, partitions)| DescribedTopicPartitions {
                    topic_id: *topic_id,
                    topic_name: topics.topic_name(*topic_id).unwrap_or_default(),
                    partitions: partitions.iter().copied().collect(),
                })
                .collect()
        };
        ConsumerGroupDescription {
            group_id: self.group_id.clone(),
            state: self.state(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor_name: self.assignor.name().to_string(),
            members: self
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.member_epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
                    subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                    assignment: describe(&m.assigned),
                    target_assignment: describe(
                        self.target_assignment
                            .get(&m.member_id)
                            .unwrap_or(&Assignment::new()),
                    ),
                    member_type: 1,
                })
                .collect(),
        }
    }
}

/// Everything a consumer group needs to come back after a restart or a
/// coordinator move: the content of Kafka's `ConsumerGroupMetadataValue`,
/// `ConsumerGroupPartitionMetadataValue`, `ConsumerGroupTargetAssignment*`,
/// `ConsumerGroupMemberMetadataValue` and
/// `ConsumerGroupCurrentMemberAssignmentValue` records, gathered per group.
/// Timers are not part of it: [`ConsumerGroupCoordinator::restore`] starts
/// them afresh, as Kafka does when it loads a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupSnapshot {
    pub group_id: String,
    pub group_epoch: Epoch,
    pub assignment_epoch: Epoch,
    /// The assignor of the last target assignment.
    pub assignor: ServerAssignor,
    /// Subscribed topic name -> its metadata when the epoch was decided.
    pub subscription_metadata: BTreeMap<String, TopicMetadata>,
    pub members: Vec<MemberSnapshot>,
}

/// One member in [`ConsumerGroupSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSnapshot {
    pub member_id: MemberId,
    pub instance_id: Option<GroupInstanceId>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Vec<String>,
    /// `None` (or empty) when the member subscribes by names only.
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<ServerAssignor>,
    pub member_epoch: Epoch,
    pub previous_member_epoch: Epoch,
    pub state: MemberState,
    pub assigned_partitions: Assignment,
    pub partitions_pending_revocation: Assignment,
    pub target_assignment: Assignment,
}

/// A snapshot that breaks the group's invariants (a corrupt or foreign
/// record): the group is not loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConsumerGroupRestoreError {
    #[error("partition {topic_id}-{partition} is owned by more than one member")]
    PartitionOwnedTwice { topic_id: TopicId, partition: i32 },
    #[error("member id {0} appears twice")]
    MemberIdTwice(MemberId),
    #[error("group.instance.id {0} belongs to two members")]
    InstanceIdTwice(GroupInstanceId),
    #[error("the assignment epoch {assignment_epoch} is ahead of the group epoch {group_epoch}")]
    AssignmentEpochAhead {
        group_epoch: Epoch,
        assignment_epoch: Epoch,
    },
    #[error("member {member_id} subscribes with an invalid regex {regex:?}")]
    InvalidRegularExpression { member_id: MemberId, regex: String },
}

impl ConsumerGroup {
    /// The group's durable state, for the driver to store after every call
    /// that changed it.
    pub fn snapshot(&self) -> ConsumerGroupSnapshot {
        ConsumerGroupSnapshot {
            group_id: self.group_id.clone(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor,
            subscription_metadata: self.subscription_metadata.clone(),
            members: self
                .members
                .values()
                .map(|m| MemberSnapshot {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    subscribed_topic_names: m.subscribed_topic_names.iter().cloned().collect(),
                    subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                    server_assignor: m.server_assignor,
                    member_epoch: m.member_epoch,
                    previous_member_epoch: m.previous_member_epoch,
                    state: m.state,
                    assigned_partitions: m.assigned.clone(),
                    partitions_pending_revocation: m.pending_revocation.clone(),
                    target_assignment: self
                        .target_assignment
                        .get(&m.member_id)
                        .cloned()
                        .unwrap_or_default(),
                })
                .collect(),
        }
    }

    /// Rebuilds a group from its snapshot, checking the invariants the
    /// state machine relies on. Every member gets a fresh session; a member
    /// that was revoking gets a fresh rebalance timeout (Kafka's
    /// `onLoaded`).
    fn from_snapshot(
        snapshot: ConsumerGroupSnapshot,
        config: &ConsumerGroupConfig,
        now_ms: i64,
    ) -> Result<Self, ConsumerGroupRestoreError> {
        if snapshot.assignment_epoch > snapshot.group_epoch {
            return Err(ConsumerGroupRestoreError::AssignmentEpochAhead {
                group_epoch: snapshot.group_epoch,
                assignment_epoch: snapshot.assignment_epoch,
            });
        }
        let mut group = ConsumerGroup::new(snapshot.group_id, snapshot.assignor);
        group.group_epoch = snapshot.group_epoch;
        group.assignment_epoch = snapshot.assignment_epoch;
        group.subscription_metadata = snapshot.subscription_metadata;
        for m in snapshot.members {
            if group.members.contains_key(&m.member_id) {
                return Err(ConsumerGroupRestoreError::MemberIdTwice(m.member_id));
            }
            if let Some(instance_id) = &m.instance_id {
                if group.static_members.contains_key(instance_id) {
                    return Err(ConsumerGroupRestoreError::InstanceIdTwice(
                        instance_id.clone(),
                    ));
                }
            }
            for (topic_id, partitions) in m
                .assigned_partitions
                .iter()
                .chain(&m.partitions_pending_revocation)
            {
                for &partition in partitions {
                    if group.partition_owners.contains_key(&(*topic_id, partition)) {
                        return Err(ConsumerGroupRestoreError::PartitionOwnedTwice {
                            topic_id: *topic_id,
                            partition,
                        });
                    }
                    group.partition_owners.insert(
                        (*topic_id, partition),
                        (m.member_id.clone(), m.member_epoch),
                    );
                }
            }
            let member = Member {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id,
                rack_id: m.rack_id,
                client_id: m.client_id,
                client_host: m.client_host,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                subscribed_topic_names: m.subscribed_topic_names.into_iter().collect(),
                subscribed_topic_regex: m.subscribed_topic_regex.filter(|r| !r.is_empty()),
                server_assignor: m.server_assignor,
                member_epoch: m.member_epoch,
                previous_member_epoch: m.previous_member_epoch,
                state: m.state,
                assigned: m.assigned_partitions,
                pending_revocation: m.partitions_pending_revocation,
            };
            if let Some(regex) = &member.subscribed_topic_regex {
                if !group.regexes.contains_key(regex) {
                    let matcher = compile_subscription_regex(regex).map_err(|_| {
                        ConsumerGroupRestoreError::InvalidRegularExpression {
                            member_id: member.member_id.clone(),
                            regex: regex.clone(),
                        }
                    })?;
                    // The subscription metadata holds every subscribed
                    // topic that existed when the epoch was decided, so the
                    // regex resolves among its names as it did then, and
                    // the next heartbeat bumps the epoch only if topics
                    // changed since.
                    let mut resolved = ResolvedRegex::new(matcher);
                    resolved.topics =
                        resolved.resolve(group.subscription_metadata.keys().map(String::as_str));
                    group.regexes.insert(regex.clone(), resolved);
                }
            }
            if let Some(instance_id) = &member.instance_id {
                group
                    .static_members
                    .insert(instance_id.clone(), member.member_id.clone());
            }
            let rebalance_deadline =
                (member.state == MemberState::UnrevokedPartitions).then(|| {
                    (
                        now_ms.saturating_add(i64::from(member.rebalance_timeout_ms.max(0))),
                        member.member_epoch,
                    )
                });
            group.timers.insert(
                member.member_id.clone(),
                MemberTimers {
                    session_deadline_ms: now_ms
                        .saturating_add(i64::from(config.session_timeout_ms)),
                    rebalance_deadline,
                },
            );
            if !m.target_assignment.is_empty() {
                group
                    .target_assignment
                    .insert(member.member_id.clone(), m.target_assignment);
            }
            group.members.insert(member.member_id.clone(), member);
        }
        Ok(group)
    }
}

/// All the consumer groups of one coordinator, by group id.
#[derive(Clone, Debug)]
pub struct ConsumerGroupCoordinator {
    config: ConsumerGroupConfig,
    groups: HashMap<String, ConsumerGroup>,
}

impl ConsumerGroupCoordinator {
    pub fn new(config: ConsumerGroupConfig) -> Self {
        ConsumerGroupCoordinator {
            config,
            groups: HashMap::new(),
        }
    }

    pub fn config(&self) -> &ConsumerGroupConfig {
        &self.config
    }

    pub fn group(&self, group_id: &str) -> Option<&ConsumerGroup> {
        self.groups.get(group_id)
    }

    /// Every group, in no particular order (ListGroups).
    pub fn groups(&self) -> impl Iterator<Item = &ConsumerGroup> {
        self.groups.values()
    }

    /// ConsumerGroupHeartbeat. A join (epoch 0) creates the group; any other
    /// epoch for a group that does not exist is GROUP_ID_NOT_FOUND, as in
    /// Kafka. The driver first calls [`make_way_for_consumer_group`] when
    /// classic groups share the id space.
    pub fn heartbeat(
        &mut self,
        group_id: &str,
        req: ConsumerHeartbeat,
        topics: &dyn TopicsView,
        now_ms: i64,
    ) -> Result<ConsumerHeartbeatReply, GroupError> {
        self.heartbeat_with(group_id, req, topics, None, now_ms)
    }

    /// [`Self::heartbeat`] for a group with its own configs: `group_config`
    /// (the broker's settings with the group's session timeout and
    /// heartbeat interval) replaces the broker's for this heartbeat.
    pub fn heartbeat_with(
        &mut self,
        group_id: &str,
        req: ConsumerHeartbeat,
        topics: &dyn TopicsView,
        group_config: Option<&ConsumerGroupConfig>,
        now_ms: i64,
    ) -> Result<ConsumerHeartbeatReply, GroupError> {
        let config = group_config.unwrap_or(&self.config);
        validate_heartbeat(group_id, &req, config)?;
        let created = !self.groups.contains_key(group_id);
        if created {
            if req.member_epoch != Epoch::JOIN {
                return Err(GroupError::GroupIdNotFound);
            }
            self.groups.insert(
                group_id.to_string(),
                ConsumerGroup::new(group_id, self.config.default_assignor()),
            );
        }
        let group = self
            .groups
            .get_mut(group_id)
            .ok_or(GroupError::GroupIdNotFound)?;
        let reply = group.heartbeat(req, topics, config, now_ms);
        // Kafka writes nothing for a failed heartbeat, so a group created
        // for it (say, a first join with an invalid regex) does not stay.
        if reply.is_err() && created {
            self.groups.remove(group_id);
        }
        reply
    }

    /// ConsumerGroupDescribe for one group.
    pub fn describe(
        &self,
        group_id: &str,
        topics: &dyn TopicsView,
    ) -> Result<ConsumerGroupDescription, GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId);
        }
        self.groups
            .get(group_id)
            .map(|g| g.describe(topics))
            .ok_or(GroupError::GroupIdNotFound)
    }

    /// OffsetCommit to a consumer group. `member_epoch` is the request's
    /// generation id field. A group this coordinator does not hold is
    /// GROUP_ID_NOT_FOUND; the driver asks the classic coordinator first
    /// when no consumer group has the id.
    pub fn validate_offset_commit(
        &self,
        group_id: &str,
        member_id: &MemberId,
        member_epoch: Epoch,
        api_version: i16,
        is_transactional: bool,
    ) -> Result<(), GroupError> {
        self.groups
            .get(group_id)
            .ok_or(GroupError::GroupIdNotFound)?
            .validate_offset_commit(member_id, member_epoch, api_version, is_transactional)
    }

    /// TxnOffsetCommit to a consumer group (Kafka's
    /// `validateTransactionalOffsetCommit` over
    /// `ConsumerGroup.validateOffsetCommit`): a producer that is not a
    /// member (epoch -1, no member id, no instance id) may commit whatever
    /// the group's members; a member must give its current epoch. A wrong
    /// epoch is ILLEGAL_GENERATION: TxnOffsetCommit before v6 cannot carry
    /// STALE_MEMBER_EPOCH.
    pub fn validate_txn_offset_commit(
        &self,
        group_id: &str,
        member_id: &MemberId,
        group_instance_id: Option<&GroupInstanceId>,
        member_epoch: Epoch,
    ) -> Result<(), GroupError> {
        let group = self
            .groups
            .get(group_id)
            .ok_or(GroupError::IllegalGeneration)?;
        if member_epoch.0 == -1 && member_id.is_unknown() && group_instance_id.is_none() {
            return Ok(());
        }
        match group.validate_offset_commit(member_id, member_epoch, 0, true) {
            Err(GroupError::StaleMemberEpoch) => Err(GroupError::IllegalGeneration),
            other => other,
        }
    }

    /// OffsetFetch v9+ with a member id and epoch.
    pub fn validate_offset_fetch(
        &self,
        group_id: &str,
        member_id: Option<&MemberId>,
        member_epoch: Epoch,
    ) -> Result<(), GroupError> {
        self.groups
            .get(group_id)
            .ok_or(GroupError::GroupIdNotFound)?
            .validate_offset_fetch(member_id, member_epoch)
    }

    /// DeleteGroups: only an empty group can go.
    pub fn delete_group(&mut self, group_id: &str) -> Result<(), GroupError> {
        let group = self
            .groups
            .get(group_id)
            .ok_or(GroupError::GroupIdNotFound)?;
        if group.state() != ConsumerGroupState::Empty {
            return Err(GroupError::NonEmptyGroup);
        }
        self.groups.remove(group_id);
        Ok(())
    }

    /// A classic JoinGroup for `group_id`: an empty consumer group gives
    /// way (Kafka converts it); a live one is INCONSISTENT_GROUP_PROTOCOL,
    /// since classic members cannot join consumer groups here (Kafka 4.x
    /// admits them as "classic members" of the consumer group).
    pub fn make_way_for_classic_group(&mut self, group_id: &str) -> Result<(), GroupError> {
        match self.groups.get(group_id) {
            None => Ok(()),
            Some(group) if group.state() == ConsumerGroupState::Empty => {
                self.groups.remove(group_id);
                Ok(())
            }
            Some(_) => Err(GroupError::InconsistentGroupProtocol),
        }
    }

    /// Expires sessions and rebalance timeouts; returns the ids of the
    /// groups that changed.
    pub fn tick(&mut self, now_ms: i64) -> Vec<String> {
        let mut changed = Vec::new();
        for (group_id, group) in &mut self.groups {
            if group.next_deadline_ms().is_some_and(|d| d <= now_ms) {
                group.tick(now_ms);
                changed.push(group_id.clone());
            }
        }
        changed
    }

    /// The earliest deadline of any group.
    pub fn next_deadline_ms(&self) -> Option<i64> {
        self.groups
            .values()
            .filter_map(ConsumerGroup::next_deadline_ms)
            .min()
    }

    /// Loads a group from its stored snapshot (this broker became its
    /// coordinator, or restarted), replacing any group of that id.
    pub fn restore(
        &mut self,
        snapshot: ConsumerGroupSnapshot,
        now_ms: i64,
    ) -> Result<(), ConsumerGroupRestoreError> {
        let group = ConsumerGroup::from_snapshot(snapshot, &self.config, now_ms)?;
        self.groups.insert(group.group_id.clone(), group);
        Ok(())
    }

    /// This broker stops coordinating these groups.
    pub fn unload(&mut self, group_ids: &[&str]) {
        for group_id in group_ids {
            self.groups.remove(*group_id);
        }
    }
}

/// A ConsumerGroupHeartbeat for `group_id` when a classic group may hold
/// the id: Kafka replaces an empty classic group on a join and answers
/// GROUP_ID_NOT_FOUND ("not a consumer group") otherwise (without online
/// migration, which this broker does not do).
pub fn make_way_for_consumer_group(
    classic: &mut GroupCoordinator,
    group_id: &str,
    member_epoch: Epoch,
    now_ms: i64,
) -> Result<(), GroupError> {
    let Some(group) = classic.group(group_id) else {
        return Ok(());
    };
    if member_epoch == Epoch::JOIN && group.state() == GroupState::Empty {
        classic.delete_group(group_id, now_ms)
    } else {
        Err(GroupError::GroupIdNotFound)
    }
}
