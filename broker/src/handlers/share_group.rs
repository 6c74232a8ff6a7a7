//! ShareGroupHeartbeat (key 76) and ShareGroupDescribe (key 77): a share
//! group's membership and its server-side assignment (KIP-932).

use kafka_protocol::messages::share_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedTopic,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{
    ShareGroupDescribeRequest, ShareGroupDescribeResponse, ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse, TopicName,
};

use super::{group_authorized_operations, str_bytes, RequestContext};
use crate::broker::Broker;
use crate::coordinator::share::{heartbeat_error, ShareHeartbeatError};
use crate::share::group::Heartbeat;

pub async fn heartbeat(
    broker: &Broker,
    ctx: &RequestContext,
    req: ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse {
    let hb = Heartbeat {
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        rack_id: req.rack_id.map(|r| r.to_string()),
        subscribed_topic_names: req
            .subscribed_topic_names
            .map(|ts| ts.into_iter().map(|t| t.0.to_string()).collect()),
        client_id: ctx.client_id.clone(),
        client_host: ctx.client_host.clone(),
    };
    let mut resp = ShareGroupHeartbeatResponse::default();
    match broker
        .groups
        .share_heartbeat(broker, &req.group_id.0, hb)
        .await
    {
        Ok(r) => {
            resp.member_id = Some(str_bytes(r.member_id));
            resp.member_epoch = r.response.member_epoch;
            resp.heartbeat_interval_ms = r.heartbeat_interval_ms;
            resp.assignment = r.response.assignment.map(|a| {
                let mut out = Assignment::default();
                out.topic_partitions = a
                    .into_iter()
                    .map(|(topic_id, partitions)| {
                        let mut tp = TopicPartitions::default();
                        tp.topic_id = topic_id;
                        tp.partitions = partitions;
                        tp
                    })
                    .collect();
                out
            });
        }
        Err(e) => {
            let (e, message) = match e {
                ShareHeartbeatError::Group(e) => (e, None),
                ShareHeartbeatError::Member(e) => heartbeat_error(e),
            };
            resp.error_code = e.code();
            resp.error_message = Some(str_bytes(
                message.map_or_else(|| e.to_string(), str::to_string),
            ));
            resp.member_epoch = -1;
        }
    }
    resp
}

pub async fn describe(
    broker: &Broker,
    req: ShareGroupDescribeRequest,
) -> ShareGroupDescribeResponse {
    let mut resp = ShareGroupDescribeResponse::default();
    let image = broker.metadata.image();
    for group_id in req.group_ids {
        let mut d = DescribedGroup::default();
        d.authorized_operations = group_authorized_operations(req.include_authorized_operations);
        match broker.groups.share_describe(&group_id.0).await {
            Err(e) => {
                d.error_code = e.code();
                d.error_message = Some(str_bytes(e.to_string()));
            }
            Ok(g) => {
                d.group_state = str_bytes(g.state());
                d.group_epoch = g.group_epoch;
                d.assignment_epoch = g.assignment_epoch;
                d.assignor_name = str_bytes("simple");
                d.members = g
                    .members
                    .into_values()
                    .map(|m| {
                        let mut x = Member::default();
                        x.member_id = str_bytes(m.member_id);
                        x.rack_id = m.rack_id.map(str_bytes);
                        x.member_epoch = m.member_epoch;
                        x.client_id = str_bytes(m.client_id);
                        x.client_host = str_bytes(m.client_host);
                        x.subscribed_topic_names = m
                            .subscribed
                            .into_iter()
                            .map(|t| TopicName(str_bytes(t)))
                            .collect();
                        let mut a = DescribedAssignment::default();
                        a.topic_partitions = m
                            .assignment
                            .into_iter()
                            .map(|(topic_id, partitions)| {
                                let mut tp = DescribedTopic::default();
                                tp.topic_id = topic_id;
                                tp.topic_name = TopicName(str_bytes(
                                    image
                                        .topic_by_id(topic_id)
                                        .map(|t| t.name.clone())
                                        .unwrap_or_default(),
                                ));
                                tp.partitions = partitions;
                                tp
                            })
                            .collect();
                        x.assignment = a;
                        x
                    })
                    .collect();
            }
        }
        d.group_id = group_id;
        resp.groups.push(d);
    }
    resp
}
