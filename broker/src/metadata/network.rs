//! The Raft network between metadata voters: openraft's RPCs carried by
//! [`transport`](super::transport) to the peer's controller listener.
//!
//! A failed call is reported as `Unreachable`, which openraft treats as "back
//! off and retry", never as a reply from the peer. A single voter never calls
//! the network at all.

use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};

use super::store::RaftNodeId;
use super::transport::{CallError, PeerClient, PeerRequest, PeerResponse};
use super::TypeConfig;

/// Hands out one [`PeerConnection`] per target voter, dialling as
/// `dialer` says (from this node's voter host, with the controller
/// listener's TLS and SASL login).
#[derive(Clone, Debug)]
pub struct MetadataNetwork {
    pub dialer: super::transport::Dialer,
}

impl RaftNetworkFactory<TypeConfig> for MetadataNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: RaftNodeId, node: &BasicNode) -> Self::Network {
        PeerConnection {
            target,
            client: PeerClient::new(node.addr.clone(), self.dialer.clone()),
        }
    }
}

/// A connection to one peer voter, kept open between RPCs.
pub struct PeerConnection {
    target: RaftNodeId,
    client: PeerClient,
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, E>>>;

impl PeerConnection {
    async fn call<E>(&mut self, req: PeerRequest, option: &RPCOption) -> RpcResult<PeerResponse, E>
    where
        E: std::error::Error,
    {
        // openraft cancels the call at hard_ttl; finishing by soft_ttl drops
        // the connection cleanly first.
        let timeout = option.soft_ttl().max(Duration::from_millis(1));
        self.client.call(&req, timeout).await.map_err(|e| {
            let error = AnyError::error(format!("voter {}: {e}", self.target));
            match e {
                CallError::NotSent { .. } => RPCError::Unreachable(Unreachable::new(&error)),
                CallError::Failed { .. } => RPCError::Network(NetworkError::new(&error)),
            }
        })
    }

    fn mismatch<E: std::error::Error>(
        &self,
    ) -> RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, E>> {
        RPCError::Network(NetworkError::new(&AnyError::error(format!(
            "voter {} answered with the wrong response type",
            self.target
        ))))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<RaftNodeId>> {
        match self.call(PeerRequest::AppendEntries(rpc), &option).await? {
            PeerResponse::AppendEntries(r) => r.map_err(|e| remote(self.target, e)),
            _ => Err(self.mismatch()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<RaftNodeId>, InstallSnapshotError> {
        match self
            .call(PeerRequest::InstallSnapshot(rpc), &option)
            .await?
        {
            PeerResponse::InstallSnapshot(r) => r.map_err(|e| remote(self.target, e)),
            _ => Err(self.mismatch()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<RaftNodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<RaftNodeId>> {
        match self.call(PeerRequest::Vote(rpc), &option).await? {
            PeerResponse::Vote(r) => r.map_err(|e| remote(self.target, e)),
            _ => Err(self.mismatch()),
        }
    }
}

fn remote<E: std::error::Error>(
    target: RaftNodeId,
    e: RaftError<RaftNodeId, E>,
) -> RPCError<RaftNodeId, BasicNode, RaftError<RaftNodeId, E>> {
    RPCError::RemoteError(openraft::error::RemoteError::new(target, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_nobody_listens_on_is_unreachable() {
        let mut factory = MetadataNetwork {
            dialer: super::super::transport::Dialer::plaintext(None),
        };
        // In this helper's port range, and never listened on by any test.
        let mut peer = factory
            .new_client(2, &BasicNode::new("127.0.0.9:41999"))
            .await;
        let option = RPCOption::new(Duration::from_millis(500));
        let vote = VoteRequest::new(openraft::Vote::new(1, 1), None);
        assert!(matches!(
            peer.vote(vote, option).await,
            Err(RPCError::Unreachable(_))
        ));
    }
}
