//! ACL bindings and the set of them the metadata image holds, indexed for
//! the per-request check. The matching rules are Kafka's
//! `StandardAuthorizerData`: a DENY that matches wins; an ALLOW for Read,
//! Write, Delete or Alter also allows Describe, and AlterConfigs allows
//! DescribeConfigs (ALLOW only: a DENY matches its own operation or ALL);
//! a binding applies to its literal name, to every name when it is the
//! literal `*`, and to every name starting with it when prefixed; its
//! principal is the request's or `User:*`, its host the client's IP or `*`.
//!
//! Invariant: pure data, no I/O; the image clones an `AclSet` on every
//! metadata command, so the set and its index sit behind one `Arc`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Kafka's `ResourceType` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
    DelegationToken,
    User,
}

impl ResourceType {
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => Self::Topic,
            3 => Self::Group,
            4 => Self::Cluster,
            5 => Self::TransactionalId,
            6 => Self::DelegationToken,
            7 => Self::User,
            _ => return None,
        })
    }

    pub fn code(self) -> i8 {
        match self {
            Self::Topic => 2,
            Self::Group => 3,
            Self::Cluster => 4,
            Self::TransactionalId => 5,
            Self::DelegationToken => 6,
            Self::User => 7,
        }
    }
}

/// Kafka's `AclOperation` codes, without UNKNOWN and ANY (filters only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
    CreateTokens,
    DescribeTokens,
    TwoPhaseCommit,
}

impl Operation {
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            2 => Self::All,
            3 => Self::Read,
            4 => Self::Write,
            5 => Self::Create,
            6 => Self::Delete,
            7 => Self::Alter,
            8 => Self::Describe,
            9 => Self::ClusterAction,
            10 => Self::DescribeConfigs,
            11 => Self::AlterConfigs,
            12 => Self::IdempotentWrite,
            13 => Self::CreateTokens,
            14 => Self::DescribeTokens,
            15 => Self::TwoPhaseCommit,
            _ => return None,
        })
    }

    pub fn code(self) -> i8 {
        match self {
            Self::All => 2,
            Self::Read => 3,
            Self::Write => 4,
            Self::Create => 5,
            Self::Delete => 6,
            Self::Alter => 7,
            Self::Describe => 8,
            Self::ClusterAction => 9,
            Self::DescribeConfigs => 10,
            Self::AlterConfigs => 11,
            Self::IdempotentWrite => 12,
            Self::CreateTokens => 13,
            Self::DescribeTokens => 14,
            Self::TwoPhaseCommit => 15,
        }
    }
}

/// Kafka's `PatternType` codes a stored binding may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PatternType {
    Literal,
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            Self::Literal => 3,
            Self::Prefixed => 4,
        }
    }
}

/// Kafka's `AclPermissionType` codes a stored binding may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Self::Deny => 2,
            Self::Allow => 3,
        }
    }
}

/// The wildcard resource name (LITERAL `*`), principal (`User:*`) and host.
pub const WILDCARD: &str = "*";
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// One ACL: who may (or may not) do what to which resources, from where.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    pub principal: String,
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// What a filter field asks for: anything, or one value.
pub type Match<T> = Option<T>;

/// An `AclBindingFilter` (DescribeAcls, DeleteAcls). `None` fields match
/// anything. `pattern` is Kafka's pattern filter: `Any`, `Match` (a literal
/// name, the wildcard and every prefix of it) or one pattern type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: Match<ResourceType>,
    pub resource_name: Option<String>,
    pub pattern: PatternFilter,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Match<Operation>,
    pub permission: Match<Permission>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternFilter {
    Any,
    Match,
    Exactly(PatternType),
}

impl AclFilter {
    /// Kafka's `AclBindingFilter.matches`.
    pub fn matches(&self, b: &AclBinding) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        self.resource_type.is_none_or(|t| t == b.resource_type)
            && self.operation.is_none_or(|o| o == b.operation)
            && self.permission.is_none_or(|p| p == b.permission)
            && eq(&self.principal, &b.principal)
            && eq(&self.host, &b.host)
            && match (self.pattern, &self.resource_name) {
                (PatternFilter::Any, name) => eq(name, &b.resource_name),
                (PatternFilter::Exactly(p), name) => {
                    p == b.pattern_type && eq(name, &b.resource_name)
                }
                (PatternFilter::Match, None) => true,
                (PatternFilter::Match, Some(name)) => match b.pattern_type {
                    PatternType::Literal => b.resource_name == *name || b.resource_name == WILDCARD,
                    PatternType::Prefixed => name.starts_with(b.resource_name.as_str()),
                },
            }
    }
}

/// What an ACL says about one request, before defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied,
    /// No ACL names the resource at all (`allow.everyone.if.no.acl.found`
    /// decides).
    NoAcls,
}

/// One binding as the index keeps it (the resource is the index key).
#[derive(Clone, Debug)]
struct Entry {
    principal: String,
    host: String,
    operation: Operation,
    permission: Permission,
}

#[derive(Clone, Debug, Default)]
struct TypeIndex {
    literal: HashMap<String, Vec<Entry>>,
    prefixed: HashMap<String, Vec<Entry>>,
    /// The lengths of the prefixes in `prefixed`: a name is looked up
    /// once per distinct length, not once per character.
    prefix_lengths: BTreeSet<usize>,
}

#[derive(Debug, Default)]
struct Inner {
    bindings: BTreeSet<AclBinding>,
    by_type: HashMap<ResourceType, TypeIndex>,
}

/// Every ACL the cluster holds, and their index.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "Vec<AclBinding>", into = "Vec<AclBinding>")]
pub struct AclSet {
    inner: Arc<Inner>,
}

impl PartialEq for AclSet {
    fn eq(&self, other: &Self) -> bool {
        self.inner.bindings == other.inner.bindings
    }
}

impl Eq for AclSet {}

impl From<Vec<AclBinding>> for AclSet {
    fn from(bindings: Vec<AclBinding>) -> Self {
        Self::from_bindings(bindings.into_iter().collect())
    }
}

impl From<AclSet> for Vec<AclBinding> {
    fn from(set: AclSet) -> Self {
        set.inner.bindings.iter().cloned().collect()
    }
}

impl AclSet {
    fn from_bindings(bindings: BTreeSet<AclBinding>) -> Self {
        let mut by_type: HashMap<ResourceType, TypeIndex> = HashMap::new();
        for b in &bindings {
            let index = by_type.entry(b.resource_type).or_default();
            let entry = Entry {
                principal: b.principal.clone(),
                host: b.host.clone(),
                operation: b.operation,
                permission: b.permission,
            };
            match b.pattern_type {
                PatternType::Literal => index
                    .literal
                    .entry(b.resource_name.clone())
                    .or_default()
                    .push(entry),
                PatternType::Prefixed => {
                    index.prefix_lengths.insert(b.resource_name.len());
                    index
                        .prefixed
                        .entry(b.resource_name.clone())
                        .or_default()
                        .push(entry)
                }
            }
        }
        AclSet {
            inner: Arc::new(Inner { bindings, by_type }),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inner.bindings.is_empty()
    }

    pub fn len(&self) -> usize {
        self.inner.bindings.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &AclBinding> {
        self.inner.bindings.iter()
    }

    pub fn contains(&self, b: &AclBinding) -> bool {
        self.inner.bindings.contains(b)
    }

    /// The set with `add` added and `remove` removed (a binding already
    /// present, or absent, is no change), index rebuilt.
    pub fn changed(&self, add: &[AclBinding], remove: &[AclBinding]) -> AclSet {
        let mut bindings = self.inner.bindings.clone();
        for b in remove {
            bindings.remove(b);
        }
        bindings.extend(add.iter().cloned());
        Self::from_bindings(bindings)
    }

    /// Kafka's `findAclRule` for one principal, host and operation on one
    /// resource.
    pub fn check(
        &self,
        principal: &str,
        host: &str,
        operation: Operation,
        resource_type: ResourceType,
        name: &str,
    ) -> Verdict {
        let Some(index) = self.inner.by_type.get(&resource_type) else {
            return Verdict::NoAcls;
        };
        let mut found = false;
        let mut allowed = false;
        let mut scan = |entries: Option<&Vec<Entry>>| -> bool {
            for e in entries.into_iter().flatten() {
                found = true;
                match entry_result(e, principal, host, operation) {
                    Some(Permission::Deny) => return true,
                    Some(Permission::Allow) => allowed = true,
                    None => {}
                }
            }
            false
        };
        if scan(index.literal.get(name)) {
            return Verdict::Denied;
        }
        for &len in index.prefix_lengths.range(..=name.len()) {
            if name.is_char_boundary(len) && scan(index.prefixed.get(&name[..len])) {
                return Verdict::Denied;
            }
        }
        if name != WILDCARD && scan(index.literal.get(WILDCARD)) {
            return Verdict::Denied;
        }
        if allowed {
            Verdict::Allowed
        } else if found {
            Verdict::Denied
        } else {
            Verdict::NoAcls
        }
    }

    /// Kafka's `authorizeByResourceType` for one operation: whether some
    /// ALLOW binding of this resource type (for this principal and host)
    /// is not covered by a DENY one. Used for IdempotentWrite's fallback
    /// ("Write on any topic").
    pub fn any_allowed(
        &self,
        principal: &str,
        host: &str,
        operation: Operation,
        resource_type: ResourceType,
    ) -> Verdict {
        let Some(index) = self.inner.by_type.get(&resource_type) else {
            return Verdict::NoAcls;
        };
        let applies = |e: &Entry, want: Permission| {
            e.permission == want
                && (e.principal == principal || e.principal == WILDCARD_PRINCIPAL)
                && (e.host == WILDCARD || e.host == host)
                && (e.operation == operation || e.operation == Operation::All)
        };
        let denied_literal: Vec<&str> = index
            .literal
            .iter()
            .filter(|(_, es)| es.iter().any(|e| applies(e, Permission::Deny)))
            .map(|(n, _)| n.as_str())
            .collect();
        if denied_literal.contains(&WILDCARD) {
            return Verdict::Denied;
        }
        let denied_prefixes: Vec<&str> = index
            .prefixed
            .iter()
            .filter(|(_, es)| es.iter().any(|e| applies(e, Permission::Deny)))
            .map(|(n, _)| n.as_str())
            .collect();
        let under_deny_prefix = |name: &str| denied_prefixes.iter().any(|p| name.starts_with(p));
        let literal = index.literal.iter().any(|(name, es)| {
            es.iter().any(|e| applies(e, Permission::Allow))
                && !denied_literal.contains(&name.as_str())
                && !under_deny_prefix(name)
        });
        let prefixed = index.prefixed.iter().any(|(name, es)| {
            es.iter().any(|e| applies(e, Permission::Allow)) && !under_deny_prefix(name)
        });
        if literal || prefixed {
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }
}

/// Kafka's `findResult`: what one binding (whose resource matches) says.
fn entry_result(e: &Entry, principal: &str, host: &str, op: Operation) -> Option<Permission> {
    if e.principal != principal && e.principal != WILDCARD_PRINCIPAL {
        return None;
    }
    if e.host != WILDCARD && e.host != host {
        return None;
    }
    if e.operation != Operation::All {
        let matches = match (e.permission, op) {
            (Permission::Allow, Operation::Describe) => matches!(
                e.operation,
                Operation::Describe
                    | Operation::Read
                    | Operation::Write
                    | Operation::Delete
                    | Operation::Alter
            ),
            (Permission::Allow, Operation::DescribeConfigs) => matches!(
                e.operation,
                Operation::DescribeConfigs | Operation::AlterConfigs
            ),
            _ => e.operation == op,
        };
        if !matches {
            return None;
        }
    }
    Some(e.permission)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        rt: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        op: Operation,
        perm: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pattern,
            principal: principal.into(),
            host: WILDCARD.into(),
            operation: op,
            permission: perm,
        }
    }

    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;

    fn set(bindings: &[AclBinding]) -> AclSet {
        AclSet::default().changed(bindings, &[])
    }

    #[test]
    fn no_acls_for_a_resource_is_its_own_verdict() {
        let s = set(&[acl(Topic, "a", Literal, "User:alice", Read, Allow)]);
        assert_eq!(
            s.check("User:alice", "1.2.3.4", Read, Topic, "b"),
            Verdict::NoAcls
        );
        assert_eq!(
            s.check("User:alice", "1.2.3.4", Read, Group, "a"),
            Verdict::NoAcls
        );
        // An ACL on the resource for someone else: denied, not "no ACLs".
        assert_eq!(
            s.check("User:bob", "1.2.3.4", Read, Topic, "a"),
            Verdict::Denied
        );
        assert_eq!(
            s.check("User:alice", "1.2.3.4", Read, Topic, "a"),
            Verdict::Allowed
        );
        // A literal name is not a prefix.
        assert_eq!(
            s.check("User:alice", "h", Read, Topic, "ab"),
            Verdict::NoAcls
        );
    }

    #[test]
    fn deny_beats_allow_from_any_pattern() {
        let s = set(&[
            acl(Topic, "*", Literal, "User:*", All, Allow),
            acl(Topic, "secret", Prefixed, "User:bob", Read, Deny),
        ]);
        assert_eq!(
            s.check("User:bob", "h", Read, Topic, "secret-1"),
            Verdict::Denied
        );
        assert_eq!(
            s.check("User:bob", "h", Write, Topic, "secret-1"),
            Verdict::Allowed
        );
        assert_eq!(
            s.check("User:bob", "h", Read, Topic, "public"),
            Verdict::Allowed
        );
        assert_eq!(
            s.check("User:alice", "h", Read, Topic, "secret-1"),
            Verdict::Allowed
        );
        // A DENY on Read does not deny Describe; DENY ALL denies everything.
        assert_eq!(
            s.check("User:bob", "h", Describe, Topic, "secret"),
            Verdict::Allowed
        );
        let s = s.changed(&[acl(Topic, "secret", Literal, "User:*", All, Deny)], &[]);
        assert_eq!(
            s.check("User:alice", "h", Describe, Topic, "secret"),
            Verdict::Denied
        );
        assert_eq!(
            s.check("User:alice", "h", Describe, Topic, "secret2"),
            Verdict::Allowed
        );
    }

    #[test]
    fn implied_operations_are_allow_only() {
        let s = set(&[
            acl(Topic, "t", Literal, "User:a", Write, Allow),
            acl(Topic, "t", Literal, "User:b", AlterConfigs, Allow),
            acl(Topic, "t", Literal, "User:c", Describe, Allow),
        ]);
        assert_eq!(
            s.check("User:a", "h", Describe, Topic, "t"),
            Verdict::Allowed
        );
        assert_eq!(s.check("User:a", "h", Read, Topic, "t"), Verdict::Denied);
        assert_eq!(
            s.check("User:b", "h", DescribeConfigs, Topic, "t"),
            Verdict::Allowed
        );
        assert_eq!(
            s.check("User:b", "h", Describe, Topic, "t"),
            Verdict::Denied
        );
        // Describe implies nothing else.
        assert_eq!(s.check("User:c", "h", Read, Topic, "t"), Verdict::Denied);
    }

    #[test]
    fn prefixes_of_several_lengths_and_hosts() {
        let mut host_acl = acl(Group, "app-", Prefixed, "User:a", Read, Allow);
        host_acl.host = "10.0.0.1".into();
        let s = set(&[
            host_acl,
            acl(Group, "app-orders-", Prefixed, "User:b", Read, Allow),
            acl(Group, "x", Prefixed, "User:b", Read, Allow),
        ]);
        assert_eq!(
            s.check("User:a", "10.0.0.1", Read, Group, "app-1"),
            Verdict::Allowed
        );
        assert_eq!(
            s.check("User:a", "10.0.0.2", Read, Group, "app-1"),
            Verdict::Denied
        );
        assert_eq!(
            s.check("User:b", "h", Read, Group, "app-orders-7"),
            Verdict::Allowed
        );
        assert_eq!(
            s.check("User:b", "h", Read, Group, "app-other"),
            Verdict::Denied
        );
        assert_eq!(s.check("User:b", "h", Read, Group, "ap"), Verdict::NoAcls);
        // A multibyte name does not split a character.
        assert_eq!(s.check("User:b", "h", Read, Group, "é"), Verdict::NoAcls);
    }

    #[test]
    fn any_allowed_respects_covering_denies() {
        let s = set(&[acl(Topic, "a", Literal, "User:a", Write, Allow)]);
        assert_eq!(s.any_allowed("User:a", "h", Write, Topic), Verdict::Allowed);
        assert_eq!(s.any_allowed("User:b", "h", Write, Topic), Verdict::Denied);
        assert_eq!(s.any_allowed("User:a", "h", Write, Group), Verdict::NoAcls);
        let s = s.changed(&[acl(Topic, "", Prefixed, "User:a", Write, Deny)], &[]);
        assert_eq!(s.any_allowed("User:a", "h", Write, Topic), Verdict::Denied);
    }

    #[test]
    fn filters_match_as_kafka_does() {
        let b = acl(Topic, "orders-", Prefixed, "User:a", Read, Allow);
        let any = AclFilter {
            resource_type: None,
            resource_name: None,
            pattern: PatternFilter::Any,
            principal: None,
            host: None,
            operation: None,
            permission: None,
        };
        assert!(any.matches(&b));
        let m = AclFilter {
            resource_name: Some("orders-eu".into()),
            pattern: PatternFilter::Match,
            ..any.clone()
        };
        assert!(m.matches(&b));
        let lit = AclFilter {
            pattern: PatternFilter::Exactly(Literal),
            ..m.clone()
        };
        assert!(!lit.matches(&b));
        let other = AclFilter {
            principal: Some("User:b".into()),
            ..any
        };
        assert!(!other.matches(&b));
    }

    #[test]
    fn set_round_trips_and_changes() {
        let a = acl(Topic, "t", Literal, "User:a", Read, Allow);
        let s = set(&[a.clone(), a.clone()]);
        assert_eq!(s.len(), 1);
        let json = serde_json::to_string(&s).unwrap();
        let back: AclSet = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            back.check("User:a", "h", Read, Topic, "t"),
            Verdict::Allowed
        );
        assert!(s.changed(&[], &[a]).is_empty());
    }
}
