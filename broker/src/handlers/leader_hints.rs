//! KIP-951: a NOT_LEADER_OR_FOLLOWER answer to Produce (v10+) or Fetch
//! (v16+) names the partition's current leader and epoch, and the response
//! carries the endpoints of the leaders it named, so the client can go there
//! without a metadata round trip.

use std::collections::BTreeSet;

use kafka_protocol::messages::{fetch_response, produce_response, BrokerId};
use kafka_protocol::protocol::StrBytes;

use super::str_bytes;
use crate::metadata::image::NO_LEADER;
use crate::metadata::MetadataImage;
use crate::types::{NodeId, TopicPartition};

/// The leaders named so far in one response.
#[derive(Default)]
pub struct LeaderHints {
    named: BTreeSet<NodeId>,
}

impl LeaderHints {
    /// The image's leader and leader epoch for `tp`, if it has a leader.
    pub fn hint(&mut self, image: &MetadataImage, tp: &TopicPartition) -> Option<(NodeId, i32)> {
        let p = image
            .topics
            .get(&*tp.topic)?
            .partitions
            .get(tp.partition as usize)?;
        if p.leader == NO_LEADER {
            return None;
        }
        self.named.insert(p.leader);
        Some((p.leader, p.leader_epoch.0))
    }

    /// The named leaders' (registration, host, port) on `listener`.
    fn endpoints<'a>(
        &'a self,
        image: &'a MetadataImage,
        listener: &'a str,
    ) -> impl Iterator<Item = (&'a crate::metadata::BrokerRegistration, &'a str, u16)> + 'a {
        self.named.iter().filter_map(move |n| {
            let b = image.brokers.get(n)?;
            let (host, port) = b.endpoint(listener)?;
            Some((b, host, port))
        })
    }

    /// The named leaders' endpoints on `listener`, in the response's own
    /// `NodeEndpoint` type (each API has one): `make` gets the node id,
    /// host, port and rack.
    pub fn endpoints_as<E>(
        &self,
        image: &MetadataImage,
        listener: &str,
        make: impl Fn(i32, StrBytes, i32, Option<StrBytes>) -> E,
    ) -> Vec<E> {
        self.endpoints(image, listener)
            .map(|(b, host, port)| {
                make(
                    b.node_id.0,
                    str_bytes(host.to_string()),
                    port as i32,
                    b.rack.clone().map(str_bytes),
                )
            })
            .collect()
    }

    pub fn fetch_endpoints(
        &self,
        image: &MetadataImage,
        listener: &str,
    ) -> Vec<fetch_response::NodeEndpoint> {
        self.endpoints_as(image, listener, |id, host, port, rack| {
            fetch_response::NodeEndpoint::default()
                .with_node_id(BrokerId(id))
                .with_host(host)
                .with_port(port)
                .with_rack(rack)
        })
    }

    pub fn produce_endpoints(
        &self,
        image: &MetadataImage,
        listener: &str,
    ) -> Vec<produce_response::NodeEndpoint> {
        self.endpoints_as(image, listener, |id, host, port, rack| {
            produce_response::NodeEndpoint::default()
                .with_node_id(BrokerId(id))
                .with_host(host)
                .with_port(port)
                .with_rack(rack)
        })
    }
}
