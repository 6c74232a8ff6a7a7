//! DeleteGroups (key 42): removes empty groups with their offsets.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::broker::Broker;
use crate::group::error_code;

pub async fn handle(broker: &Broker, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut resp = DeleteGroupsResponse::default();
    for group_id in req.groups_names {
        let mut r = DeletableGroupResult::default();
        r.error_code = error_code(broker.groups.delete_group(&group_id.0).await.err());
        r.group_id = group_id;
        resp.results.push(r);
    }
    resp
}
