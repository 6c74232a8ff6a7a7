//! DescribeGroups (key 15): state, protocol and members of groups. A group
//! that does not exist is reported as Dead with no error (v0-5), as Kafka
//! does before v6.

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{DescribeGroupsRequest, DescribeGroupsResponse};

use super::{group_authorized_operations, str_bytes};
use crate::broker::Broker;
use crate::group::GroupState;

pub async fn handle(broker: &Broker, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut resp = DescribeGroupsResponse::default();
    for group_id in req.groups {
        let mut d = DescribedGroup::default();
        d.authorized_operations = group_authorized_operations(req.include_authorized_operations);
        let described = match broker.groups.describe(&group_id.0).await {
            Ok(g) => g,
            Err(e) => {
                d.error_code = e.code();
                d.group_id = group_id;
                resp.groups.push(d);
                continue;
            }
        };
        match described {
            None => {
                d.group_state = str_bytes(GroupState::Dead.as_str());
                d.protocol_type = str_bytes("");
                d.protocol_data = str_bytes("");
            }
            Some(g) => {
                d.group_state = str_bytes(g.state.as_str());
                d.protocol_type = str_bytes(g.protocol_type);
                d.protocol_data = str_bytes(g.protocol_name);
                d.members = g
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut dm = DescribedGroupMember::default();
                        dm.member_id = str_bytes(m.member_id);
                        dm.group_instance_id = m.group_instance_id.map(str_bytes);
                        dm.client_id = str_bytes(m.client_id);
                        dm.client_host = str_bytes(m.client_host);
                        dm.member_metadata = m.metadata;
                        dm.member_assignment = m.assignment;
                        dm
                    })
                    .collect();
            }
        }
        d.group_id = group_id;
        resp.groups.push(d);
    }
    resp
}
