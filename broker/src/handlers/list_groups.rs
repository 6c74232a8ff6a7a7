//! ListGroups (key 16): every group this coordinator owns, filtered by
//! state (v4+) and type (v5+).

use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse};

use super::str_bytes;
use crate::broker::Broker;

pub async fn handle(broker: &Broker, version: i16, req: ListGroupsRequest) -> ListGroupsResponse {
    let states: Vec<String> = if version >= 4 {
        req.states_filter.iter().map(|s| s.to_lowercase()).collect()
    } else {
        Vec::new()
    };
    let types: Vec<String> = if version >= 5 {
        req.types_filter.iter().map(|s| s.to_lowercase()).collect()
    } else {
        Vec::new()
    };
    let mut resp = ListGroupsResponse::default();
    for g in broker.groups.list().await {
        if !states.is_empty() && !states.contains(&g.state.to_lowercase()) {
            continue;
        }
        if !types.is_empty() && !types.iter().any(|t| t == g.group_type) {
            continue;
        }
        let mut l = ListedGroup::default();
        l.group_id = GroupId(str_bytes(g.group_id));
        l.protocol_type = str_bytes(g.protocol_type);
        l.group_state = str_bytes(g.state);
        l.group_type = str_bytes(g.group_type);
        resp.groups.push(l);
    }
    resp
}
