//! CreateAcls (30), DescribeAcls (29) and DeleteAcls (31): ACL bindings in
//! the metadata quorum, with the validation of Kafka's `AclApis` and
//! `AclControlManager`. Without an authorizer all three answer
//! SECURITY_DISABLED, as Kafka does. CreateAcls and DeleteAcls need Alter
//! on the cluster, DescribeAcls Describe.

use std::collections::BTreeMap;

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::authz::{
    AclBinding, AclFilter, Authz, Operation, PatternFilter, PatternType, Permission, ResourceType,
    CLUSTER_NAME,
};
use crate::broker::{metadata_error, Broker};
use crate::metadata::MetadataCommand;

const NO_AUTHORIZER: &str = "No Authorizer is configured.";

type Refusal = (ResponseError, String);

fn invalid(message: impl Into<String>) -> Refusal {
    (ResponseError::InvalidRequest, message.into())
}

/// The request-wide refusal, if any: no authorizer, or not allowed `op`
/// on the cluster.
fn refusal(authz: &Authz<'_>, op: Operation) -> Option<Refusal> {
    if !authz.enabled() {
        return Some((ResponseError::SecurityDisabled, NO_AUTHORIZER.into()));
    }
    if !authz.allows_cluster(op) {
        return Some((
            ResponseError::ClusterAuthorizationFailed,
            ResponseError::ClusterAuthorizationFailed.to_string(),
        ));
    }
    None
}

/// A principal is `Type:name` (Kafka's `SecurityUtils.parseKafkaPrincipal`).
fn check_principal(principal: &str) -> Result<(), Refusal> {
    match principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => Ok(()),
        _ => Err(invalid(format!(
            "Could not parse principal from `{principal}` (no colon is present separating the principal type from the principal name)"
        ))),
    }
}

fn binding(c: &AclCreation) -> Result<AclBinding, Refusal> {
    let resource_type = ResourceType::from_code(c.resource_type)
        .ok_or_else(|| invalid(format!("Invalid resourceType {}", c.resource_type)))?;
    let pattern_type = match c.resource_pattern_type {
        3 => PatternType::Literal,
        4 => PatternType::Prefixed,
        other => return Err(invalid(format!("Invalid patternType {other}"))),
    };
    let operation = Operation::from_code(c.operation)
        .ok_or_else(|| invalid(format!("Invalid operation {}", c.operation)))?;
    let permission = match c.permission_type {
        2 => Permission::Deny,
        3 => Permission::Allow,
        other => return Err(invalid(format!("Invalid permissionType {other}"))),
    };
    if resource_type == ResourceType::Cluster && c.resource_name.as_str() != CLUSTER_NAME {
        return Err(invalid(format!(
            "The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
        )));
    }
    if c.resource_name.is_empty() {
        return Err(invalid("Invalid empty resource name specified"));
    }
    check_principal(&c.principal)?;
    Ok(AclBinding {
        resource_type,
        resource_name: c.resource_name.to_string(),
        pattern_type,
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation,
        permission,
    })
}

/// A filter from the wire's codes; UNKNOWN (or any code we do not know)
/// is INVALID_REQUEST, as Kafka's `validateFilter`.
fn filter(
    resource_type: i8,
    resource_name: &Option<StrBytes>,
    pattern_type: i8,
    principal: &Option<StrBytes>,
    host: &Option<StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, Refusal> {
    let unknown = || invalid("Unknown patternFilter.");
    let resource_type = match resource_type {
        1 => None,
        code => Some(ResourceType::from_code(code).ok_or_else(unknown)?),
    };
    let pattern = match pattern_type {
        1 => PatternFilter::Any,
        2 => PatternFilter::Match,
        3 => PatternFilter::Exactly(PatternType::Literal),
        4 => PatternFilter::Exactly(PatternType::Prefixed),
        _ => return Err(unknown()),
    };
    let unknown_entry = || invalid("Unknown entryFilter.");
    let operation = match operation {
        1 => None,
        code => Some(Operation::from_code(code).ok_or_else(unknown_entry)?),
    };
    let permission = match permission {
        1 => None,
        2 => Some(Permission::Deny),
        3 => Some(Permission::Allow),
        _ => return Err(unknown_entry()),
    };
    Ok(AclFilter {
        resource_type,
        resource_name: resource_name.as_ref().map(|s| s.to_string()),
        pattern,
        principal: principal.as_ref().map(|s| s.to_string()),
        host: host.as_ref().map(|s| s.to_string()),
        operation,
        permission,
    })
}

pub async fn create(
    broker: &Broker,
    authz: &Authz<'_>,
    req: CreateAclsRequest,
) -> CreateAclsResponse {
    let result = |e: Option<&Refusal>| {
        AclCreationResult::default()
            .with_error_code(e.map_or(0, |(code, _)| code.code()))
            .with_error_message(e.map(|(_, m)| str_bytes(m.clone())))
    };
    if let Some(r) = refusal(authz, Operation::Alter) {
        return CreateAclsResponse::default()
            .with_results(req.creations.iter().map(|_| result(Some(&r))).collect());
    }
    let checked: Vec<Result<AclBinding, Refusal>> = req.creations.iter().map(binding).collect();
    let create: Vec<AclBinding> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok().cloned())
        .collect();
    let written = if create.is_empty() {
        Ok(())
    } else {
        broker
            .metadata
            .propose(MetadataCommand::AlterAcls {
                create,
                delete: Vec::new(),
            })
            .await
            .map(|_| ())
            .map_err(|e| (metadata_error(&e), e.to_string()))
    };
    let results = checked
        .iter()
        .map(|c| match (c, &written) {
            (Err(e), _) | (Ok(_), Err(e)) => result(Some(e)),
            (Ok(_), Ok(())) => result(None),
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

pub fn describe(
    broker: &Broker,
    authz: &Authz<'_>,
    req: DescribeAclsRequest,
) -> DescribeAclsResponse {
    let fail = |(code, message): Refusal| {
        DescribeAclsResponse::default()
            .with_error_code(code.code())
            .with_error_message(Some(str_bytes(message)))
    };
    if let Some(r) = refusal(authz, Operation::Describe) {
        return fail(r);
    }
    let f = match filter(
        req.resource_type_filter,
        &req.resource_name_filter,
        req.pattern_type_filter,
        &req.principal_filter,
        &req.host_filter,
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(r) => return fail(r),
    };
    let image = broker.metadata.image();
    // Grouped by resource pattern, as Kafka's `DescribeAclsResponse.aclsResources`.
    let mut by_resource: BTreeMap<(i8, &str, i8), Vec<AclDescription>> = BTreeMap::new();
    for b in image.acls.iter().filter(|b| f.matches(b)) {
        by_resource
            .entry((
                b.resource_type.code(),
                &b.resource_name,
                b.pattern_type.code(),
            ))
            .or_default()
            .push(
                AclDescription::default()
                    .with_principal(str_bytes(b.principal.clone()))
                    .with_host(str_bytes(b.host.clone()))
                    .with_operation(b.operation.code())
                    .with_permission_type(b.permission.code()),
            );
    }
    let resources = by_resource
        .into_iter()
        .map(|((rt, name, pt), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(rt)
                .with_resource_name(str_bytes(name))
                .with_pattern_type(pt)
                .with_acls(acls)
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

pub async fn delete(
    broker: &Broker,
    authz: &Authz<'_>,
    req: DeleteAclsRequest,
) -> DeleteAclsResponse {
    let failed = |(code, message): &Refusal| {
        DeleteAclsFilterResult::default()
            .with_error_code(code.code())
            .with_error_message(Some(str_bytes(message.clone())))
    };
    if let Some(r) = refusal(authz, Operation::Alter) {
        return DeleteAclsResponse::default()
            .with_filter_results(req.filters.iter().map(|_| failed(&r)).collect());
    }
    let image = broker.metadata.image();
    let matched: Vec<Result<Vec<AclBinding>, Refusal>> = req
        .filters
        .iter()
        .map(|d| {
            let f = filter(
                d.resource_type_filter,
                &d.resource_name_filter,
                d.pattern_type_filter,
                &d.principal_filter,
                &d.host_filter,
                d.operation,
                d.permission_type,
            )?;
            Ok(image
                .acls
                .iter()
                .filter(|b| f.matches(b))
                .cloned()
                .collect())
        })
        .collect();
    let mut delete: Vec<AclBinding> = matched.iter().flatten().flatten().cloned().collect();
    delete.sort();
    delete.dedup();
    let written = if delete.is_empty() {
        Ok(())
    } else {
        broker
            .metadata
            .propose(MetadataCommand::AlterAcls {
                create: Vec::new(),
                delete,
            })
            .await
            .map(|_| ())
            .map_err(|e| (metadata_error(&e), e.to_string()))
    };
    let results = matched
        .into_iter()
        .map(|m| match (m, &written) {
            (Err(e), _) => failed(&e),
            (Ok(_), Err(e)) => failed(e),
            (Ok(bindings), Ok(())) => DeleteAclsFilterResult::default().with_matching_acls(
                bindings
                    .into_iter()
                    .map(|b| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(b.resource_type.code())
                            .with_resource_name(str_bytes(b.resource_name))
                            .with_pattern_type(b.pattern_type.code())
                            .with_principal(str_bytes(b.principal))
                            .with_host(str_bytes(b.host))
                            .with_operation(b.operation.code())
                            .with_permission_type(b.permission.code())
                    })
                    .collect(),
            ),
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
