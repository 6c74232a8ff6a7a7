//! The wire between metadata voters: length-prefixed JSON frames over TCP on
//! the controller listener.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of JSON.
//! The length is checked against [`MAX_FRAME_BYTES`] before the body is read;
//! a frame that is too large or does not decode closes the connection. One
//! connection carries one request at a time: the caller writes a request and
//! reads its response before writing the next.
//!
//! The requests are Raft's three RPCs (vote, append entries, install snapshot),
//! a metadata command forwarded to the leader, a broker heartbeat to the active
//! controller, and a read-index request (the leader's commit point, which a
//! starting follower waits to apply). Every call is bounded by a timeout, so a
//! dead peer costs the caller that timeout and nothing more.
//!
//! The listener serves only connections from an address of a configured
//! voter's host, at most `controller.max.connections.per.voter` from each,
//! and a node connects to its peers from its own voter address
//! ([`crate::net::connect_from`]). On an SSL or SASL_* controller listener a
//! voter must also authenticate before its first request is read
//! ([`PeerServerAuth`]): TLS with a client certificate the truststore
//! verifies (SSL), or a SASL login (SASL_*) carried by this transport's own
//! handshake: the dialling voter sends [`AuthRequest`] frames (the mechanism
//! and a SASL token, the same tokens Kafka's SaslAuthenticate carries) and
//! the listener answers each with an [`AuthResponse`] (a challenge, done
//! with the final server token, or failed with Kafka's message) and closes
//! the connection after a failure. The authenticated principal must be in
//! `super.users` when that is set. A served connection is closed when idle
//! for `connections.max.idle.ms` between requests, or when a request (or
//! the authentication) does not complete within the frame timeout (the
//! quorum's request timeout: its sender gave up by then), and a frame's
//! buffer grows with the bytes that arrive, not with the length it
//! declares.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::image::{MetadataCommand, MetadataError, MetadataOutcome};
use super::store::RaftNodeId;
use super::TypeConfig;
use crate::security::peer::{PeerSecurity, PeerServerAuth, PeerStream};
use crate::security::sasl::{ClientStep, CredentialSource, NoCredentials, Step};
use crate::types::NodeId;

/// The largest frame either side accepts. Raft batches entries (at most
/// `max_payload_entries` per append) and chunks snapshots, so a frame this
/// large only comes from a peer that is broken or not a peer.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The largest authentication frame either side accepts: PLAIN's and
/// SCRAM's tokens are some hundred bytes.
pub const MAX_AUTH_FRAME_BYTES: usize = 64 << 10;

/// A dialling voter's SASL token, before its first request.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuthRequest {
    /// Kafka's mechanism name (`PLAIN`).
    pub mechanism: String,
    pub token: Vec<u8>,
}

/// The controller listener's answer to an [`AuthRequest`].
#[derive(Debug, Serialize, Deserialize)]
pub enum AuthResponse {
    /// Send the next token.
    Challenge(Vec<u8>),
    /// Authenticated; the server's final token.
    Done(Vec<u8>),
    /// Refused (the connection closes): why, in Kafka's words.
    Failed(String),
}

/// A broker's periodic "I am alive" to the active controller (Kafka's
/// BrokerHeartbeat, without the offsets KRaft uses to decide catch-up).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub node_id: NodeId,
}

/// The controller's answer: whether the image shows the broker registered
/// and whether it is fenced (a fenced broker registers again to be unfenced).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatReply {
    pub registered: bool,
    pub fenced: bool,
}

#[derive(Serialize, Deserialize)]
pub enum PeerRequest {
    Vote(VoteRequest<RaftNodeId>),
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A metadata command for the leader to propose; answered with its result.
    Write(MetadataCommand),
    Heartbeat(HeartbeatRequest),
    /// Asks the leader to confirm its leadership and name the log index up to
    /// which a reader must have applied to see every committed change.
    ReadIndex,
    /// Asks the leader for its view of the quorum (DescribeQuorum).
    QuorumInfo,
}

#[derive(Serialize, Deserialize)]
pub enum PeerResponse {
    Vote(Result<VoteResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    AppendEntries(Result<AppendEntriesResponse<RaftNodeId>, RaftError<RaftNodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<RaftNodeId>, RaftError<RaftNodeId, InstallSnapshotError>>,
    ),
    /// The command's result and the log index of its entry (so the caller
    /// can wait to apply it before reading its own image).
    Write(Result<MetadataOutcome, MetadataError>, Option<u64>),
    Heartbeat(Result<HeartbeatReply, MetadataError>),
    ReadIndex(Result<Option<u64>, MetadataError>),
    QuorumInfo(super::quorum_info::QuorumInfo),
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Writes `value` as one frame and flushes.
pub async fn write_frame<W, T>(w: &mut W, value: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(value)?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body.len() as u64));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

/// Reads one frame. `Ok(None)` is a clean end of stream before a frame began.
pub async fn read_frame<R, T>(r: &mut R) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    read_frame_limited(r, MAX_FRAME_BYTES).await
}

/// [`read_frame`] with a smaller limit than [`MAX_FRAME_BYTES`].
async fn read_frame_limited<R, T>(r: &mut R, limit: usize) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > limit.min(MAX_FRAME_BYTES) {
        return Err(FrameError::TooLarge(len as u64));
    }
    // Grown as the bytes arrive: a declared length alone allocates nothing.
    let mut body = Vec::new();
    r.take(len as u64).read_to_end(&mut body).await?;
    if body.len() < len {
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    Ok(Some(serde_json::from_slice(&body)?))
}

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection was made: the peer certainly did not see the request.
    #[error("cannot connect to {addr}: {reason}")]
    NotSent { addr: String, reason: String },
    /// The request may or may not have reached the peer.
    #[error("call to {addr} failed: {reason}")]
    Failed { addr: String, reason: String },
}

/// How this node dials its peers' controller listeners: from its own voter
/// host, with the controller listener's TLS and SASL login.
#[derive(Clone, Debug)]
pub struct Dialer {
    /// This node's voter host, which connections are made from (peers serve
    /// only voters' addresses); `None` lets the kernel choose.
    pub source_host: Option<String>,
    pub security: Arc<PeerSecurity>,
}

impl Dialer {
    /// Plain TCP from `source_host`.
    pub fn plaintext(source_host: Option<String>) -> Self {
        Self {
            source_host,
            security: Arc::new(PeerSecurity::plaintext()),
        }
    }

    /// A connection to `addr`, authenticated when the listener wants it.
    async fn connect(&self, addr: &str) -> Result<PeerStream, String> {
        let tcp = crate::net::connect_from(addr, self.source_host.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let mut stream = self
            .security
            .secure(tcp, host)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if let Some((mechanism, mut client)) = self.security.sasl_client() {
            let failed = |e: String| format!("SASL {mechanism}: {e}");
            let mut token = client.initial();
            // PLAIN takes one round; a listener that wants many is not a voter.
            let mut rounds = 0;
            loop {
                rounds += 1;
                if rounds > 4 {
                    return Err(failed("the exchange does not end".into()));
                }
                let req = AuthRequest {
                    mechanism: mechanism.name().to_string(),
                    token,
                };
                write_frame(&mut stream, &req)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let resp = read_frame_limited(&mut stream, MAX_AUTH_FRAME_BYTES)
                    .await
                    .map_err(|e| failed(e.to_string()))?
                    .ok_or_else(|| failed("connection closed".into()))?;
                match resp {
                    AuthResponse::Challenge(bytes) => match client.step(&bytes).map_err(failed)? {
                        ClientStep::Send(next) => token = next,
                        ClientStep::Done => {
                            return Err(failed("the listener wants more than the mechanism".into()))
                        }
                    },
                    AuthResponse::Done(bytes) => match client.step(&bytes).map_err(failed)? {
                        ClientStep::Done => break,
                        ClientStep::Send(_) => {
                            return Err(failed("the listener finished early".into()))
                        }
                    },
                    AuthResponse::Failed(message) => return Err(failed(message)),
                }
            }
        }
        Ok(stream)
    }
}

/// A client connection to one peer, reconnected on demand. Any error or
/// timeout drops the connection, so a half-read response never desyncs the
/// next call.
pub struct PeerClient {
    addr: String,
    dialer: Dialer,
    stream: Option<PeerStream>,
}

impl PeerClient {
    pub fn new(addr: String, dialer: Dialer) -> Self {
        Self {
            addr,
            dialer,
            stream: None,
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `req` and waits for its response, all within `timeout`.
    ///
    /// Cancellation-safe: the connection is taken out of `self` for the call
    /// and put back only after a whole response was read, so a call dropped
    /// midway (openraft times RPCs out itself) closes the connection instead
    /// of leaving a late response to be read as the answer to the next request.
    pub async fn call(
        &mut self,
        req: &PeerRequest,
        timeout: Duration,
    ) -> Result<PeerResponse, CallError> {
        let addr = self.addr.clone();
        let dialer = &self.dialer;
        let reused = self.stream.take();
        let result = tokio::time::timeout(timeout, async {
            let mut stream = match reused {
                Some(stream) => stream,
                None => dialer
                    .connect(&addr)
                    .await
                    .map_err(|reason| CallError::NotSent {
                        addr: addr.clone(),
                        reason,
                    })?,
            };
            let failed = |reason: String| CallError::Failed {
                addr: addr.clone(),
                reason,
            };
            write_frame(&mut stream, req)
                .await
                .map_err(|e| failed(e.to_string()))?;
            match read_frame(&mut stream).await {
                Ok(Some(resp)) => Ok((resp, stream)),
                Ok(None) => Err(failed("connection closed before the response".into())),
                Err(e) => Err(failed(e.to_string())),
            }
        })
        .await;
        match result {
            Ok(Ok((resp, stream))) => {
                self.stream = Some(stream);
                Ok(resp)
            }
            Ok(Err(e)) => Err(e),
            Err(_elapsed) => Err(CallError::Failed {
                addr,
                reason: format!("no answer within {} ms", timeout.as_millis()),
            }),
        }
    }
}

/// Sends one request on a fresh connection: for forwarded writes, where a
/// stale pooled connection would make a failure ambiguous for no reason.
pub async fn call_once(
    addr: &str,
    dialer: &Dialer,
    req: &PeerRequest,
    timeout: Duration,
) -> Result<PeerResponse, CallError> {
    PeerClient::new(addr.to_string(), dialer.clone())
        .call(req, timeout)
        .await
}

/// What answers the requests a peer sends.
pub trait PeerHandler: Send + Sync + 'static {
    fn handle(
        &self,
        req: PeerRequest,
    ) -> impl std::future::Future<Output = PeerResponse> + Send + '_;
}

/// Who may connect to the controller listener, and how long a request may
/// take to arrive.
#[derive(Clone)]
pub struct PeerAccess {
    /// How a voter authenticates (TLS, SASL) and who is authorized.
    pub auth: Arc<PeerServerAuth>,
    /// Every voter's host (this node's included: a node may forward to
    /// itself through the wire when it is the leader of its own view).
    pub voter_hosts: Vec<String>,
    /// Connections served at once from one voter's address (its Raft
    /// replication and votes, heartbeats, and forwarded writes, reads and
    /// DescribeQuorum calls, the latter each on a short-lived connection).
    /// Voters sharing an address share a multiple of it.
    pub max_connections_per_voter: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// A request must arrive whole within this long of its first byte.
    pub frame_timeout: Duration,
}

impl PeerAccess {
    /// The voters whose host `ip` is an address of.
    async fn voters_at(&self, ip: std::net::IpAddr) -> usize {
        let mut n = 0;
        for host in &self.voter_hosts {
            if crate::net::is_address_of(host, ip).await {
                n += 1;
            }
        }
        n
    }
}

/// Accepts peer connections until `shutdown` turns true, then drops every
/// connection it serves.
pub async fn serve<H: PeerHandler>(
    listener: TcpListener,
    handler: Arc<H>,
    access: PeerAccess,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Some(acceptor) = access.auth.acceptor() {
        // Certificates are re-read when their files change, as on the
        // client listeners.
        acceptor.spawn_watch(Duration::from_secs(10), shutdown.clone());
    }
    let per_address: Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>> = Arc::default();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a controller connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let ip = peer.ip().to_canonical();
                let voters = access.voters_at(ip).await;
                if voters == 0 {
                    metrics::counter!("kafka_controller_connections_closed_total", "reason" => "not_a_voter")
                        .increment(1);
                    tracing::warn!(%peer, "controller connection from an address of no voter; closing it");
                    continue;
                }
                let limit = voters * access.max_connections_per_voter;
                let Some(slot) = AddressSlot::take(&per_address, ip, limit) else {
                    metrics::counter!("kafka_controller_connections_closed_total", "reason" => "per_voter_limit")
                        .increment(1);
                    tracing::warn!(%peer, "too many controller connections from this voter's address; closing this one");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let auth = access.auth.clone();
                let (idle_timeout, frame_timeout) = (access.idle_timeout, access.frame_timeout);
                connections.spawn(async move {
                    let admitted = match tokio::time::timeout(frame_timeout, admit(stream, &auth)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(reason)) => {
                            metrics::counter!("kafka_controller_connections_closed_total", "reason" => "unauthenticated")
                                .increment(1);
                            tracing::warn!(%peer, %reason, "controller connection not authenticated; closing it");
                            return;
                        }
                        Err(_) => {
                            metrics::counter!("kafka_controller_connections_closed_total", "reason" => "frame_timeout")
                                .increment(1);
                            return;
                        }
                    };
                    if let Err(e) = serve_connection(admitted, handler.as_ref(), idle_timeout, frame_timeout).await {
                        tracing::debug!(%peer, error = %e, "controller connection closed");
                    }
                    drop(slot);
                });
            }
        }
    }
    connections.shutdown().await;
}

/// One of the connections an address may hold; given back when dropped.
struct AddressSlot {
    counts: Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>,
    ip: std::net::IpAddr,
}

impl AddressSlot {
    fn take(
        counts: &Arc<std::sync::Mutex<HashMap<std::net::IpAddr, usize>>>,
        ip: std::net::IpAddr,
        limit: usize,
    ) -> Option<Self> {
        let mut map = counts.lock().expect("poisoned");
        let n = map.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Self {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut map = self.counts.lock().expect("poisoned");
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// The TLS handshake and SASL login the listener's protocol asks for, and
/// the check that the principal may be a voter. `Err` with why not.
async fn admit(tcp: TcpStream, auth: &PeerServerAuth) -> Result<PeerStream, String> {
    let (mut stream, principal) = auth.accept(tcp).await.map_err(|e| e.to_string())?;
    let principal = if auth.protocol().uses_sasl() {
        Some(sasl_login(&mut stream, auth).await?)
    } else {
        principal
    };
    // PLAINTEXT has no principal: the voter-address check above is all it gets.
    if let Some(p) = principal {
        if !auth.authorized(&p) {
            return Err(format!("User:{p} is not one of super.users"));
        }
    }
    Ok(stream)
}

/// The server side of the SASL handshake; the principal it authenticated.
async fn sasl_login(stream: &mut PeerStream, auth: &PeerServerAuth) -> Result<String, String> {
    let refuse = |message: String| AuthResponse::Failed(message);
    let first: AuthRequest = read_frame_limited(stream, MAX_AUTH_FRAME_BYTES)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("closed before authenticating")?;
    let Some((mechanism, cfg)) = auth.mechanism(&first.mechanism) else {
        let message = format!("Unsupported SASL mechanism {}", first.mechanism);
        let _ = write_frame(stream, &refuse(message.clone())).await;
        return Err(message);
    };
    let creds: Arc<dyn CredentialSource> = Arc::new(NoCredentials);
    let mut server = crate::security::sasl::authenticator(mechanism, &cfg, &creds);
    let mut token = first.token;
    for _ in 0..4 {
        match server.step(&token) {
            Step::Challenge(bytes) => {
                write_frame(stream, &AuthResponse::Challenge(bytes))
                    .await
                    .map_err(|e| e.to_string())?;
                let next: AuthRequest = read_frame_limited(stream, MAX_AUTH_FRAME_BYTES)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("closed while authenticating")?;
                token = next.token;
            }
            Step::Done {
                principal,
                response,
                ..
            } => {
                if !auth.authorized(&principal) {
                    let message = format!("User:{principal} is not one of super.users");
                    let _ = write_frame(stream, &refuse(message.clone())).await;
                    return Err(message);
                }
                write_frame(stream, &AuthResponse::Done(response))
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(principal);
            }
            Step::Failed { message } => {
                let _ = write_frame(stream, &refuse(message.clone())).await;
                return Err(message);
            }
        }
    }
    Err("the SASL exchange does not end".into())
}

async fn serve_connection<H: PeerHandler>(
    stream: PeerStream,
    handler: &H,
    idle_timeout: Duration,
    frame_timeout: Duration,
) -> Result<(), FrameError> {
    // Buffered, so that waiting for a request's first byte (under the idle
    // timeout) consumes nothing the frame reader then misses, TLS or not.
    let mut stream = BufReader::new(stream);
    loop {
        // Idle between requests for at most the idle timeout; once a
        // request's first byte is here, all of it within the frame timeout.
        match tokio::time::timeout(idle_timeout, stream.fill_buf()).await {
            Err(_) => return Ok(()),
            Ok(Ok([])) => return Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
        let req: PeerRequest = match tokio::time::timeout(frame_timeout, read_frame(&mut stream))
            .await
        {
            Ok(Ok(Some(req))) => req,
            Ok(Ok(None)) => return Ok(()),
            Err(_) => {
                metrics::counter!("kafka_controller_connections_closed_total", "reason" => "frame_timeout")
                        .increment(1);
                return Ok(());
            }
            Ok(Err(e)) => return Err(e),
        };
        let resp = handler.handle(req).await;
        write_frame(stream.get_mut(), &resp).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let req = PeerRequest::Heartbeat(HeartbeatRequest { node_id: NodeId(3) });
        write_frame(&mut a, &req).await.unwrap();
        write_frame(&mut a, &PeerRequest::ReadIndex).await.unwrap();
        drop(a);
        let first: PeerRequest = read_frame(&mut b).await.unwrap().unwrap();
        assert!(matches!(
            first,
            PeerRequest::Heartbeat(HeartbeatRequest { node_id: NodeId(3) })
        ));
        let second: PeerRequest = read_frame(&mut b).await.unwrap().unwrap();
        assert!(matches!(second, PeerRequest::ReadIndex));
        // A clean end of stream between frames is not an error.
        assert!(read_frame::<_, PeerRequest>(&mut b)
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn oversized_length_is_rejected_before_the_body() {
        let (mut a, mut b) = tokio::io::duplex(64);
        // Only the length is written: reading must fail without waiting for a body.
        a.write_all(&((MAX_FRAME_BYTES as u32) + 1).to_be_bytes())
            .await
            .unwrap();
        let result = read_frame::<_, PeerRequest>(&mut b).await;
        assert!(matches!(result, Err(FrameError::TooLarge(n)) if n == MAX_FRAME_BYTES as u64 + 1));
    }

    #[tokio::test]
    async fn malformed_and_truncated_frames_are_errors() {
        let (mut a, mut b) = tokio::io::duplex(64);
        a.write_all(&5u32.to_be_bytes()).await.unwrap();
        a.write_all(b"{nope").await.unwrap();
        assert!(matches!(
            read_frame::<_, PeerRequest>(&mut b).await,
            Err(FrameError::Malformed(_))
        ));
        // A length promising more bytes than arrive before the end of stream.
        a.write_all(&10u32.to_be_bytes()).await.unwrap();
        a.write_all(b"{}").await.unwrap();
        drop(a);
        assert!(matches!(
            read_frame::<_, PeerRequest>(&mut b).await,
            Err(FrameError::Io(_))
        ));
    }

    /// Serves connections from 127.0.0.1, the kernel's choice of source
    /// address on loopback.
    fn loopback_voter() -> PeerAccess {
        PeerAccess {
            auth: Arc::new(PeerServerAuth::plaintext()),
            voter_hosts: vec!["127.0.0.1".into()],
            max_connections_per_voter: 16,
            idle_timeout: Duration::from_secs(600),
            frame_timeout: Duration::from_secs(2),
        }
    }

    struct Echo;

    impl PeerHandler for Echo {
        async fn handle(&self, req: PeerRequest) -> PeerResponse {
            match req {
                PeerRequest::Heartbeat(h) => PeerResponse::Heartbeat(Ok(HeartbeatReply {
                    registered: h.node_id == NodeId(1),
                    fenced: false,
                })),
                _ => PeerResponse::ReadIndex(Ok(Some(7))),
            }
        }
    }

    #[tokio::test]
    async fn server_answers_and_closes_on_malformed_frames() {
        let listener = TcpListener::bind("127.0.0.9:41990").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, Arc::new(Echo), loopback_voter(), stop_rx));

        let mut client = PeerClient::new(addr.clone(), Dialer::plaintext(None));
        let timeout = Duration::from_secs(5);
        for _ in 0..2 {
            let resp = client
                .call(
                    &PeerRequest::Heartbeat(HeartbeatRequest { node_id: NodeId(1) }),
                    timeout,
                )
                .await
                .unwrap();
            assert!(matches!(
                resp,
                PeerResponse::Heartbeat(Ok(HeartbeatReply {
                    registered: true,
                    fenced: false
                }))
            ));
        }
        let resp = call_once(
            &addr,
            &Dialer::plaintext(None),
            &PeerRequest::ReadIndex,
            timeout,
        )
        .await
        .unwrap();
        assert!(matches!(resp, PeerResponse::ReadIndex(Ok(Some(7)))));

        // Garbage gets the connection closed, not an answer.
        let mut raw = TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&3u32.to_be_bytes()).await.unwrap();
        raw.write_all(b"???").await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(timeout, raw.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0);

        let _ = stop_tx.send(true);
        tokio::time::timeout(timeout, server)
            .await
            .unwrap()
            .unwrap();
        // With the server gone, a call fails instead of hanging.
        let err = client
            .call(&PeerRequest::ReadIndex, Duration::from_millis(500))
            .await;
        assert!(err.is_err());
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        // Accepts but never answers.
        let listener = TcpListener::bind("127.0.0.9:41991").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hold = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        });
        let started = std::time::Instant::now();
        let err = call_once(
            &addr,
            &Dialer::plaintext(None),
            &PeerRequest::ReadIndex,
            Duration::from_millis(200),
        )
        .await;
        assert!(matches!(err, Err(CallError::Failed { .. })));
        assert!(started.elapsed() < Duration::from_secs(5));
        hold.abort();
    }

    /// Counts the requests that reach it.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl PeerHandler for Counting {
        async fn handle(&self, _req: PeerRequest) -> PeerResponse {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            PeerResponse::ReadIndex(Ok(Some(7)))
        }
    }

    async fn closed(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    #[tokio::test]
    async fn only_voters_are_served_and_idle_sockets_cannot_lock_one_out() {
        let listener = TcpListener::bind("127.0.0.9:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let handler = Arc::new(Counting::default());
        let access = PeerAccess {
            auth: Arc::new(PeerServerAuth::plaintext()),
            voter_hosts: vec!["127.0.0.7".into(), "127.0.0.8".into()],
            max_connections_per_voter: 16,
            idle_timeout: Duration::from_secs(600),
            frame_timeout: Duration::from_millis(300),
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let server = tokio::spawn(serve(listener, handler.clone(), access, stop_rx));
        let timeout = Duration::from_secs(5);
        let write = PeerRequest::Write(crate::metadata::MetadataCommand::FenceBroker {
            node_id: NodeId(1),
        });

        // A stranger (127.0.0.1) is closed on before anything is read: its
        // write never reaches the handler.
        let err = call_once(&addr, &Dialer::plaintext(None), &write, timeout).await;
        assert!(
            matches!(err, Err(CallError::Failed { .. })),
            "{:?}",
            err.err()
        );
        assert_eq!(handler.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Nor can a hundred of its idle sockets take any room.
        let mut strangers = Vec::new();
        for _ in 0..100 {
            strangers.push(TcpStream::connect(&addr).await.unwrap());
        }
        // A voter's address may hold 16 connections; one more is closed,
        // and the other voter is served all the same.
        let mut idle = Vec::new();
        for _ in 0..16 {
            idle.push(
                crate::net::connect_from(&addr, Some("127.0.0.7"))
                    .await
                    .unwrap(),
            );
        }
        let resp = call_once(
            &addr,
            &Dialer::plaintext(Some("127.0.0.8".into())),
            &PeerRequest::ReadIndex,
            timeout,
        )
        .await;
        assert!(matches!(resp, Ok(PeerResponse::ReadIndex(Ok(Some(7))))));
        let mut extra = crate::net::connect_from(&addr, Some("127.0.0.7"))
            .await
            .unwrap();
        assert!(closed(&mut extra).await, "over the per-voter limit");
        for s in &mut strangers {
            assert!(closed(s).await, "a stranger's socket is closed");
        }

        // A request that starts and stalls is closed after the frame timeout,
        // which gives its slot back.
        let mut stalled = idle.pop().unwrap();
        stalled.write_all(&100u32.to_be_bytes()).await.unwrap();
        stalled.write_all(b"{").await.unwrap();
        assert!(closed(&mut stalled).await, "a stalled request is closed");
        let resp = call_once(
            &addr,
            &Dialer::plaintext(Some("127.0.0.7".into())),
            &PeerRequest::ReadIndex,
            timeout,
        )
        .await;
        assert!(matches!(resp, Ok(PeerResponse::ReadIndex(Ok(Some(7))))));

        let _ = stop_tx.send(true);
        tokio::time::timeout(timeout, server)
            .await
            .unwrap()
            .unwrap();
    }
}
