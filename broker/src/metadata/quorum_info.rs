//! What the metadata quorum looks like, for DescribeQuorum: the leader and
//! its term, and each voter's log end. Only the leader knows every voter's
//! replicated position, so a follower asks it (as a Kafka broker forwards
//! DescribeQuorum to the active controller); when that fails, it answers from
//! its own view and reports what it cannot know as unknown (-1).

use openraft::{BasicNode, Raft};
use serde::{Deserialize, Serialize};

use super::store::RaftNodeId;
use super::transport::{self, PeerRequest, PeerResponse};
use super::{broker_node_id, MetadataController, TypeConfig};
use crate::types::NodeId;

/// One voter as DescribeQuorum reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoterInfo {
    pub node_id: NodeId,
    /// The voter's controller listener, as the membership records it.
    pub addr: String,
    /// The offset after the voter's last replicated entry, when known here.
    pub log_end_offset: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumInfo {
    pub leader: Option<NodeId>,
    /// The Raft term: Kafka's leader epoch of the metadata log.
    pub term: u64,
    /// The offset after the last applied (so committed) entry.
    pub high_watermark: u64,
    pub voters: Vec<VoterInfo>,
}

impl MetadataController {
    /// The leader's view of the quorum, or this node's own when the leader
    /// is this node, unknown, or does not answer in time.
    pub async fn quorum_info(&self) -> QuorumInfo {
        if let Some((leader, addr)) = self.current_leader() {
            if leader != self.raft_id {
                if let Ok(PeerResponse::QuorumInfo(info)) = transport::call_once(
                    &addr,
                    &self.dialer,
                    &PeerRequest::QuorumInfo,
                    self.request_timeout,
                )
                .await
                {
                    return info;
                }
            }
        }
        from_metrics(&self.raft, self.raft_id)
    }
}

/// One node's view of the quorum, from its openraft metrics.
pub(super) fn from_metrics(raft: &Raft<TypeConfig>, me: RaftNodeId) -> QuorumInfo {
    let m = raft.metrics().borrow().clone();
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
