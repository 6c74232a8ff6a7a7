//! The Raft network between metadata voters.
//!
//! Today every cluster is a single voter. A single voter commits on its own
//! append and never calls the network, so every RPC here answers `Unreachable`:
//! that is the truthful answer for a peer this node has no transport to, and
//! openraft treats it as "back off and retry", never as a reply from the peer.
//! The RPC transport between voters arrives with multi-voter clusters; until
//! then `MetadataController::open` only ever forms a one-voter membership.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};

use super::store::RaftNodeId;
use super::TypeConfig;

/// Hands out one [`PeerConnection`] per target voter.
#[derive(Clone, Debug, Default)]
pub struct MetadataNetwork;

impl RaftNetworkFactory<TypeConfig> for MetadataNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: RaftNodeId, node: &BasicNode) -> Self::Network {
        PeerConnection {
            target,
            addr: node.addr.clone(),
        }
    }
}

/// A connection to one peer voter. Without a transport, every RPC fails as unreachable.
#[derive(Clone, Debug)]
pub struct PeerConnection {
    target: RaftNodeId,
    addr: String,
}

impl PeerConnection {
    fn unreachable(&self) -> Unreachable {
        Unreachable::from(AnyError::error(format!(
            "no metadata transport to voter {} at {}: only single-voter clusters are supported",
            self.target, self.addr
        )))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        AppendEntriesResponse<RaftNodeId>,
        RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>,
    > {
        Err(RPCError::Unreachable(self.unreachable()))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<RaftNodeId>,
        RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(self.unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<RaftNodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<RaftNodeId>, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId>>>
    {
        Err(RPCError::Unreachable(self.unreachable()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_rpc_to_a_peer_is_unreachable() {
        let mut factory = MetadataNetwork;
        let mut peer = factory
            .new_client(2, &BasicNode::new("127.0.0.1:9093"))
            .await;
        let option = RPCOption::new(std::time::Duration::from_millis(10));
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        assert!(matches!(
            peer.vote(vote, option).await,
            Err(RPCError::Unreachable(_))
        ));
    }
}
