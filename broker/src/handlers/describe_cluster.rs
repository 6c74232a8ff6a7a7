//! DescribeCluster (key 60): the brokers of the cluster and its id.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::ResponseError;

use super::{str_bytes, AUTHORIZED_OPERATIONS_OMITTED};
use crate::broker::Broker;

pub fn handle(
    broker: &Broker,
    listener: &str,
    _version: i16,
    req: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let mut resp = DescribeClusterResponse::default();
    resp.endpoint_type = req.endpoint_type;
    // A broker answers for brokers (1); asking it for controllers (2) is
    // what Kafka rejects with UNSUPPORTED_ENDPOINT_TYPE.
    if req.endpoint_type != 1 {
        resp.error_code = ResponseError::UnsupportedEndpointType.code();
        resp.error_message = Some(str_bytes("The endpoint type requested is not supported"));
        return resp;
    }
    let image = broker.metadata.image();
    resp.cluster_id = str_bytes(image.cluster_id.clone());
    resp.controller_id = BrokerId(super::metadata::controller_id(broker).0);
    resp.cluster_authorized_operations = AUTHORIZED_OPERATIONS_OMITTED;
    resp.brokers = super::metadata::live_brokers(broker, listener)
        .into_iter()
        .map(|(id, host, port, rack)| {
            let mut b = DescribeClusterBroker::default();
            b.broker_id = BrokerId(id);
            b.host = str_bytes(host);
            b.port = port;
            b.rack = rack.map(str_bytes);
            b
        })
        .collect();
    resp
}
