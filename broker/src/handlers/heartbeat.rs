//! Heartbeat (key 12): a classic-group member is alive, and learns whether
//! it must rejoin.

use kafka_protocol::messages::{HeartbeatRequest, HeartbeatResponse};

use crate::broker::Broker;
use crate::group::{error_code, GenerationId, GroupInstanceId, HeartbeatRequest as Beat, MemberId};

pub async fn handle(broker: &Broker, req: HeartbeatRequest) -> HeartbeatResponse {
    let beat = Beat {
        member_id: MemberId(req.member_id.to_string()),
        group_instance_id: req
            .group_instance_id
            .map(|i| GroupInstanceId(i.to_string())),
        generation_id: GenerationId(req.generation_id),
    };
    let mut resp = HeartbeatResponse::default();
    resp.error_code = error_code(broker.groups.heartbeat(&req.group_id.0, &beat).await.err());
    resp
}
