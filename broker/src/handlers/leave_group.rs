//! LeaveGroup (key 13): members leave a classic group (v3+ several at once,
//! which is how admin tools remove static members).

use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{LeaveGroupRequest, LeaveGroupResponse};

use super::str_bytes;
use crate::broker::Broker;
use crate::group::{error_code, GroupInstanceId, LeaveMember, MemberId};

pub async fn handle(broker: &Broker, version: i16, req: LeaveGroupRequest) -> LeaveGroupResponse {
    let members: Vec<LeaveMember> = if version >= 3 {
        req.members
            .into_iter()
            .map(|m| LeaveMember {
                member_id: MemberId(m.member_id.to_string()),
                group_instance_id: m.group_instance_id.map(|i| GroupInstanceId(i.to_string())),
            })
            .collect()
    } else {
        vec![LeaveMember {
            member_id: MemberId(req.member_id.to_string()),
            group_instance_id: None,
        }]
    };
    let mut resp = LeaveGroupResponse::default();
    match broker.groups.leave(&req.group_id.0, &members).await {
        Err(e) => resp.error_code = e.code(),
        Ok(results) if version >= 3 => {
            resp.members = results
                .into_iter()
                .map(|r| {
                    let mut m = MemberResponse::default();
                    m.member_id = str_bytes(r.member_id.0);
                    m.group_instance_id = r.group_instance_id.map(|i| str_bytes(i.0));
                    m.error_code = error_code(r.error);
                    m
                })
                .collect();
        }
        // One member: its result is the response's.
        Ok(results) => resp.error_code = error_code(results.into_iter().find_map(|r| r.error)),
    }
    resp
}
