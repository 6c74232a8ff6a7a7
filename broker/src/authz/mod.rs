//! Authorization: Kafka's `StandardAuthorizer` behind
//! `authorizer.class.name`. The ACLs live in the metadata image (so they
//! replicate and survive restarts); [`Authz`] is one request's view of
//! them: its principal, its host, the image it read, and the broker's
//! `super.users` and `allow.everyone.if.no.acl.found`.
//!
//! Without an authorizer an `Authz` is `Open` and every check is one
//! branch that allows.
//!
//! Invariant: nothing here does I/O; which operation an API needs is the
//! handlers' business (see `handlers/`), whether a principal may do it is
//! decided here.

pub mod acl;

use std::sync::Arc;

pub use acl::{
    AclBinding, AclFilter, AclSet, Operation, PatternFilter, PatternType, Permission, ResourceType,
    Verdict,
};

use crate::config::ServerConfig;
use crate::handlers::RequestContext;
use crate::metadata::MetadataImage;

/// The one `authorizer.class.name` the broker accepts.
pub const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// The cluster resource's only name.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// One request's authorization checks.
pub enum Authz<'a> {
    /// No authorizer configured: everything is allowed.
    Open,
    Acls {
        image: Arc<MetadataImage>,
        principal: &'a str,
        host: String,
        super_user: bool,
        allow_if_no_acl: bool,
    },
}

impl<'a> Authz<'a> {
    pub fn new(
        config: &ServerConfig,
        image: impl FnOnce() -> Arc<MetadataImage>,
        ctx: &'a RequestContext,
    ) -> Self {
        if !config.authorizer_enabled {
            return Authz::Open;
        }
        let principal: &str = &ctx.principal;
        Authz::Acls {
            image: image(),
            principal,
            // Kafka matches an ACL's host against the client's IP address.
            host: ctx.client_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            super_user: config.super_users.iter().any(|s| s == principal),
            allow_if_no_acl: config.allow_everyone_if_no_acl_found,
        }
    }

    pub fn enabled(&self) -> bool {
        matches!(self, Authz::Acls { .. })
    }

    /// Whether the principal may do `op` on the resource, counted when
    /// denied (a check made only to fill `authorized_operations` or to
    /// filter a listing uses [`Authz::may`]).
    pub fn allows(&self, op: Operation, resource_type: ResourceType, name: &str) -> bool {
        let allowed = self.may(op, resource_type, name);
        if !allowed {
            metrics::counter!("kafka_broker_authorization_denied_total", "resource_type" => resource_type_name(resource_type), "operation" => operation_name(op)).increment(1);
        }
        allowed
    }

    /// [`Authz::allows`] without the metric.
    pub fn may(&self, op: Operation, resource_type: ResourceType, name: &str) -> bool {
        match self {
            Authz::Open => true,
            Authz::Acls {
                image,
                principal,
                host,
                super_user,
                allow_if_no_acl,
            } => {
                *super_user
                    || match image.acls.check(principal, host, op, resource_type, name) {
                        Verdict::Allowed => true,
                        Verdict::Denied => false,
                        Verdict::NoAcls => *allow_if_no_acl,
                    }
            }
        }
    }

    pub fn allows_cluster(&self, op: Operation) -> bool {
        self.allows(op, ResourceType::Cluster, CLUSTER_NAME)
    }

    /// Whether some resource of this type allows `op` (Kafka's
    /// `authorizeByResourceType`): InitProducerId without a transactional
    /// id is allowed with IdempotentWrite on the cluster or Write on any
    /// topic.
    pub fn allows_any(&self, op: Operation, resource_type: ResourceType) -> bool {
        match self {
            Authz::Open => true,
            Authz::Acls {
                image,
                principal,
                host,
                super_user,
                allow_if_no_acl,
            } => {
                *super_user
                    || match image.acls.any_allowed(principal, host, op, resource_type) {
                        Verdict::Allowed => true,
                        Verdict::Denied => false,
                        Verdict::NoAcls => *allow_if_no_acl,
                    }
            }
        }
    }

    /// Kafka's `authorized_operations` bit set for one resource: the
    /// operations of `ops` the principal may do.
    pub fn operations(&self, resource_type: ResourceType, name: &str, ops: &[Operation]) -> i32 {
        ops.iter()
            .filter(|op| self.may(**op, resource_type, name))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }
}

/// The operations Kafka lists in `authorized_operations` per resource type.
pub const TOPIC_OPERATIONS: &[Operation] = &[
    Operation::Read,
    Operation::Write,
    Operation::Create,
    Operation::Delete,
    Operation::Alter,
    Operation::Describe,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
];
pub const GROUP_OPERATIONS: &[Operation] =
    &[Operation::Read, Operation::Delete, Operation::Describe];
pub const CLUSTER_OPERATIONS: &[Operation] = &[
    Operation::Create,
    Operation::Alter,
    Operation::Describe,
    Operation::ClusterAction,
    Operation::DescribeConfigs,
    Operation::AlterConfigs,
    Operation::IdempotentWrite,
];

fn resource_type_name(t: ResourceType) -> &'static str {
    match t {
        ResourceType::Topic => "Topic",
        ResourceType::Group => "Group",
        ResourceType::Cluster => "Cluster",
        ResourceType::TransactionalId => "TransactionalId",
        ResourceType::DelegationToken => "DelegationToken",
        ResourceType::User => "User",
    }
}

fn operation_name(op: Operation) -> &'static str {
    match op {
        Operation::All => "All",
        Operation::Read => "Read",
        Operation::Write => "Write",
        Operation::Create => "Create",
        Operation::Delete => "Delete",
        Operation::Alter => "Alter",
        Operation::Describe => "Describe",
        Operation::ClusterAction => "ClusterAction",
        Operation::DescribeConfigs => "DescribeConfigs",
        Operation::AlterConfigs => "AlterConfigs",
        Operation::IdempotentWrite => "IdempotentWrite",
        Operation::CreateTokens => "CreateTokens",
        Operation::DescribeTokens => "DescribeTokens",
        Operation::TwoPhaseCommit => "TwoPhaseCommit",
    }
}
