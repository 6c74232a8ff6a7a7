//! ConsumerGroupHeartbeat (key 68): the KIP-848 consumer protocol. One
//! request joins, heartbeats, reconciles and leaves; the coordinator
//! computes the assignment.

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};

use super::{str_bytes, RequestContext};
use crate::broker::Broker;
use crate::group::consumer::{ConsumerHeartbeat, Epoch, TopicId};
use crate::group::{GroupInstanceId, MemberId};

pub async fn handle(
    broker: &Broker,
    ctx: &RequestContext,
    version: i16,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let heartbeat = ConsumerHeartbeat {
        member_id: MemberId(req.member_id.to_string()),
        member_epoch: Epoch(req.member_epoch),
        instance_id: req.instance_id.map(|i| GroupInstanceId(i.to_string())),
        rack_id: req.rack_id.map(|r| r.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .map(|ts| ts.into_iter().map(|t| t.0.to_string()).collect()),
        // "" clears a member's regex (Kafka's rule); librdkafka sends it
        // with every name subscription, which clears nothing.
        subscribed_topic_regex: if version >= 1 {
            req.subscribed_topic_regex.map(|r| r.to_string())
        } else {
            None
        },
        server_assignor: req.server_assignor.map(|a| a.to_string()),
        owned_topic_partitions: req.topic_partitions.map(|tps| {
            tps.into_iter()
                .map(|tp| (TopicId(tp.topic_id), tp.partitions.into_iter().collect()))
                .collect()
        }),
        api_version: version,
        client_id: ctx.client_id.clone(),
        client_host: ctx.client_host.clone(),
    };
    let mut resp = ConsumerGroupHeartbeatResponse::default();
    match broker
        .groups
        .consumer_heartbeat(broker, &req.group_id.0, heartbeat)
        .await
    {
        Ok(r) => {
            resp.member_id = Some(str_bytes(r.member_id.0));
            resp.member_epoch = r.member_epoch.0;
            resp.heartbeat_interval_ms = r.heartbeat_interval_ms;
            resp.assignment = r.assignment.map(|a| {
                let mut out = Assignment::default();
                out.topic_partitions = a
                    .into_iter()
                    .map(|(topic_id, partitions)| {
                        let mut tp = TopicPartitions::default();
                        tp.topic_id = topic_id.0;
                        tp.partitions = partitions.into_iter().collect();
                        tp
                    })
                    .collect();
                out
            });
        }
        Err(e) => {
            resp.error_code = e.code();
            resp.error_message = Some(str_bytes(e.to_string()));
            resp.member_epoch = -1;
        }
    }
    resp
}
