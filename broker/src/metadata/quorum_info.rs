//! What this node knows about the metadata quorum, for DescribeQuorum: the
//! leader and its term, and each voter's log end as far as this node can see.
//! The leader knows every voter's replicated position; a follower knows only
//! its own and says so (-1 for the others), rather than guessing.

use openraft::BasicNode;

use super::store::RaftNodeId;
use super::{broker_node_id, MetadataController};
use crate::types::NodeId;

/// One voter as DescribeQuorum reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoterInfo {
    pub node_id: NodeId,
    /// The voter's controller listener, as the membership records it.
    pub addr: String,
    /// The offset after the voter's last replicated entry, when known here.
    pub log_end_offset: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuorumInfo {
    pub leader: Option<NodeId>,
    /// The Raft term: Kafka's leader epoch of the metadata log.
    pub term: u64,
    /// The offset after the last applied (so committed) entry.
    pub high_watermark: u64,
    pub voters: Vec<VoterInfo>,
}

impl MetadataController {
    pub fn quorum_info(&self) -> QuorumInfo {
        let m = self.raft.metrics().borrow().clone();
        let me: RaftNodeId = self.raft_id;
        let next = |index: Option<u64>| index.map(|i| i + 1);
        let membership = m.membership_config.membership();
        let voters = membership
            .voter_ids()
            .filter_map(|id| {
                let node_id = broker_node_id(id)?;
                let addr = membership
                    .get_node(&id)
                    .map(|n: &BasicNode| n.addr.clone())
                    .unwrap_or_default();
                let log_end_offset = if id == me {
                    next(m.last_log_index)
                } else {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id).cloned().flatten())
                        .map(|log_id| log_id.index + 1)
                };
                Some(VoterInfo {
                    node_id,
                    addr,
                    log_end_offset,
                })
            })
            .collect();
        QuorumInfo {
            leader: m.current_leader.and_then(broker_node_id),
            term: m.current_term,
            high_watermark: m.last_applied.map_or(0, |l| l.index + 1),
            voters,
        }
    }
}
