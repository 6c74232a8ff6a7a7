//! DeleteGroups (key 42): removes empty groups with their offsets, and a
//! share group with the share coordinator's state of its partitions.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{DeleteGroupsRequest, DeleteGroupsResponse};

use crate::broker::Broker;
use crate::group::error_code;

pub async fn handle(broker: &Broker, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut resp = DeleteGroupsResponse::default();
    for group_id in req.groups_names {
        let mut r = DeletableGroupResult::default();
        let share_partitions = broker.groups.share_partitions(&group_id.0).await.ok();
        let deleted = broker.groups.delete_group(&group_id.0).await;
        if let (Ok(()), Some(partitions)) = (&deleted, share_partitions) {
            super::share_offsets::delete_group_state(broker, &group_id.0, partitions).await;
        }
        r.error_code = error_code(deleted.err());
        r.group_id = group_id;
        resp.results.push(r);
    }
    resp
}
