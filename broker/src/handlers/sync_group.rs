//! SyncGroup (key 14): the leader hands out the assignment; every member
//! gets its own part, possibly after waiting for the leader.

use kafka_protocol::messages::{SyncGroupRequest, SyncGroupResponse};

use super::str_bytes;
use crate::broker::Broker;
use crate::group::{GenerationId, GroupInstanceId, MemberId, SyncRequest};

pub async fn handle(broker: &Broker, version: i16, req: SyncGroupRequest) -> SyncGroupResponse {
    let request = SyncRequest {
        member_id: MemberId(req.member_id.to_string()),
        group_instance_id: req
            .group_instance_id
            .map(|i| GroupInstanceId(i.to_string())),
        generation_id: GenerationId(req.generation_id),
        protocol_type: req.protocol_type.map(|s| s.to_string()),
        protocol_name: req.protocol_name.map(|s| s.to_string()),
        assignments: req
            .assignments
            .into_iter()
            .map(|a| (MemberId(a.member_id.to_string()), a.assignment))
            .collect(),
    };
    let r = broker.groups.sync(&req.group_id.0, request).await;
    let mut resp = SyncGroupResponse::default();
    resp.error_code = r.error_code();
    if version >= 5 {
        resp.protocol_type = r.protocol_type.map(str_bytes);
        resp.protocol_name = r.protocol_name.map(str_bytes);
    }
    resp.assignment = r.assignment;
    resp
}
