//! KIP-951: a NOT_LEADER_OR_FOLLOWER answer to Produce (v10+) or Fetch
//! (v16+) names the partition's current leader and epoch, and the response
//! carries the endpoints of the leaders it named, so the client can go there
//! without a metadata round trip.

use std::collections::BTreeSet;

use kafka_protocol::messages::{fetch_response, produce_response, BrokerId};

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

    fn endpoints<'a>(
        &'a self,
        image: &'a MetadataImage,
    ) -> impl Iterator<Item = &'a crate::metadata::BrokerRegistration> + 'a {
        self.named.iter().filter_map(|n| image.brokers.get(n))
    }

    pub fn fetch_endpoints(&self, image: &MetadataImage) -> Vec<fetch_response::NodeEndpoint> {
        self.endpoints(image)
            .map(|b| {
                let mut e = fetch_response::NodeEndpoint::default();
                e.node_id = BrokerId(b.node_id.0);
                e.host = str_bytes(b.host.clone());
                e.port = b.port as i32;
                e.rack = b.rack.clone().map(str_bytes);
                e
            })
            .collect()
    }

    pub fn produce_endpoints(&self, image: &MetadataImage) -> Vec<produce_response::NodeEndpoint> {
        self.endpoints(image)
            .map(|b| {
                let mut e = produce_response::NodeEndpoint::default();
                e.node_id = BrokerId(b.node_id.0);
                e.host = str_bytes(b.host.clone());
                e.port = b.port as i32;
                e.rack = b.rack.clone().map(str_bytes);
                e
            })
            .collect()
    }
}
