//! ConsumerGroupDescribe (key 69): members, epochs and assignments of
//! KIP-848 groups. A classic group is GROUP_ID_NOT_FOUND, which is how
//! admin clients know to fall back to DescribeGroups.

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment, DescribedGroup, Member, TopicPartitions,
};
use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName,
};

use super::{group_authorized_operations, str_bytes};
use crate::broker::Broker;
use crate::group::consumer::DescribedTopicPartitions;

fn assignment(parts: Vec<DescribedTopicPartitions>) -> Assignment {
    let mut a = Assignment::default();
    a.topic_partitions = parts
        .into_iter()
        .map(|p| {
            let mut tp = TopicPartitions::default();
            tp.topic_id = p.topic_id.0;
            tp.topic_name = TopicName(str_bytes(p.topic_name));
            tp.partitions = p.partitions;
            tp
        })
        .collect();
    a
}

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut resp = ConsumerGroupDescribeResponse::default();
    for group_id in req.group_ids {
        let mut d = DescribedGroup::default();
        d.authorized_operations = group_authorized_operations(req.include_authorized_operations);
        match broker.groups.consumer_describe(broker, &group_id.0).await {
            Err(e) => {
                d.error_code = e.code();
                d.error_message = Some(str_bytes(e.to_string()));
            }
            Ok(g) => {
                d.group_state = str_bytes(g.state.as_str());
                d.group_epoch = g.group_epoch.0;
                d.assignment_epoch = g.assignment_epoch.0;
                d.assignor_name = str_bytes(g.assignor_name);
                d.members = g
                    .members
                    .into_iter()
                    .map(|m| {
                        let mut x = Member::default();
                        x.member_id = str_bytes(m.member_id.0);
                        x.instance_id = m.instance_id.map(|i| str_bytes(i.0));
                        x.rack_id = m.rack_id.map(str_bytes);
                        x.member_epoch = m.member_epoch.0;
                        x.client_id = str_bytes(m.client_id);
                        x.client_host = str_bytes(m.client_host);
                        x.subscribed_topic_names = m
                            .subscribed_topic_names
                            .into_iter()
                            .map(|t| TopicName(str_bytes(t)))
                            .collect();
                        x.subscribed_topic_regex = m.subscribed_topic_regex.map(str_bytes);
                        x.assignment = assignment(m.assignment);
                        x.target_assignment = assignment(m.target_assignment);
                        // v1+: 1 = a member of the consumer protocol.
                        if version >= 1 {
                            x.member_type = m.member_type;
                        }
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
