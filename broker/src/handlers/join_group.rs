//! JoinGroup (key 11): a classic-group member joins or rejoins; the
//! response may wait for the rebalance (see `coordinator`).

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{JoinGroupRequest, JoinGroupResponse};

use super::{str_bytes, RequestContext};
use crate::broker::Broker;
use crate::group::{GroupInstanceId, JoinRequest, MemberId, Protocol};

pub async fn handle(
    broker: &Broker,
    ctx: &RequestContext,
    version: i16,
    req: JoinGroupRequest,
) -> JoinGroupResponse {
    let request = JoinRequest {
        member_id: MemberId(req.member_id.to_string()),
        group_instance_id: req
            .group_instance_id
            .map(|i| GroupInstanceId(i.to_string())),
        client_id: ctx.client_id.clone(),
        client_host: ctx.client_host.clone(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: the session timeout serves.
        rebalance_timeout_ms: if version >= 1 {
            req.rebalance_timeout_ms
        } else {
            -1
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .into_iter()
            .map(|p| Protocol {
                name: p.name.to_string(),
                metadata: p.metadata,
            })
            .collect(),
        requires_known_member_id: version >= 4,
        supports_skip_assignment: version >= 9,
    };
    let r = broker.groups.join(&req.group_id.0, request).await;
    let mut resp = JoinGroupResponse::default();
    resp.error_code = r.error_code();
    resp.generation_id = r.generation_id.0;
    // Before v7 the protocol name is not nullable.
    resp.protocol_type = r.protocol_type.map(str_bytes);
    resp.protocol_name = match r.protocol_name {
        Some(n) => Some(str_bytes(n)),
        None if version < 7 => Some(str_bytes("")),
        None => None,
    };
    resp.leader = str_bytes(r.leader.0);
    resp.skip_assignment = r.skip_assignment;
    resp.member_id = str_bytes(r.member_id.0);
    resp.members = r
        .members
        .into_iter()
        .map(|m| {
            let mut out = JoinGroupResponseMember::default();
            out.member_id = str_bytes(m.member_id.0);
            out.group_instance_id = m.group_instance_id.map(|i| str_bytes(i.0));
            out.metadata = m.metadata;
            out
        })
        .collect();
    resp
}
