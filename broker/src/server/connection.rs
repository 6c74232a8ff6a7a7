//! One client connection. A reader task reads, walks and decodes requests
//! ahead (at most `queued.max.requests` of them); this task executes them
//! one at a time, in order, and writes each response before starting the
//! next.
//!
//! Executing in order is deliberate and is what Kafka does (it mutes a
//! channel while a request is in flight): an idempotent producer pipelines
//! up to five produce requests per partition and relies on them being
//! appended in the order sent.
//!
//! What a request costs is charged to the broker's memory budget
//! (`queued.max.request.bytes`) as it arrives: its bytes as they come off
//! the socket, then its decoded size as the guard computes it, before it is
//! decoded; all of it is given back once the request is answered. A request
//! whose decoded size alone exceeds the budget closes the connection, like
//! a frame over `socket.request.max.bytes`. A request must arrive whole
//! within `socket.request.read.timeout.ms` of its first byte (waiting for
//! budget counts), and a connection with nothing arriving and nothing in
//! progress for `connections.max.idle.ms` is closed.
//!
//! A response is written as its parts: encoded bytes go through one buffered
//! writer, and a Fetch response's records go from the segment files straight
//! to the socket (`sendfile` on Linux, as Kafka's `FileRecords.writeTo`), so
//! they are never copied into this process.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use protocol::fetch_response::{encode_fetch_response, Part};
use protocol::{
    check_request, encode_response, unsupported_api_versions_response,
    unsupported_produce_response, Request, RequestError,
};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::budget::{Charge, MemoryBudget};
use super::session::{Gate, Session};
use super::stream::{ReadSource, ResponseSink};
use super::ListenerContext;
use crate::broker::Broker;
use crate::handlers::fetch::FetchedRecords;
use crate::handlers::{dispatch, Reply, RequestContext};
use crate::log::FileRegion;

/// A frame up to this size gets its whole buffer when its first body bytes
/// arrive (every ordinary request: clients cap theirs at about 1 MiB); a
/// larger one grows its buffer as its bytes arrive, so a header declaring
/// 100 MB costs nothing until the bytes come.
const EAGER_FRAME_BYTES: usize = 1 << 20;

/// The most budget one read takes ahead of the bytes it returns.
const MAX_READ_BYTES: usize = 1 << 20;

/// What the reader hands the executor.
// The large variant is the common case and is moved once per request;
// boxing it would add an allocation to every request for no gain.
#[allow(clippy::large_enum_variant)]
enum Inbound {
    Request(Request),
    /// A bare SASL token, after a SaslHandshake v0.
    SaslToken(Bytes),
    /// An answer made without decoding (a version we refuse politely).
    Answer(Bytes),
}

/// A request read off the socket, holding its charge on the memory budget
/// until it has been answered.
struct Frame {
    inbound: Inbound,
    charge: Charge,
    /// The request's size on the wire (a produce quota counts it).
    frame_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds socket.request.max.bytes")]
    FrameTooLarge(i64),
    #[error("request of {frame_bytes} bytes decodes to {decoded_bytes} more, beyond queued.max.request.bytes ({limit_bytes})")]
    DecodedTooLarge {
        frame_bytes: usize,
        decoded_bytes: u64,
        limit_bytes: usize,
    },
    #[error(
        "request not complete within socket.request.read.timeout.ms ({received} of {size} bytes)"
    )]
    RequestReadTimeout { received: usize, size: usize },
    #[error("idle for connections.max.idle.ms")]
    Idle,
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("closing unauthenticated connection: {0}")]
    Unauthenticated(String),
    #[error("SASL frame of {0} bytes exceeds sasl.server.max.receive.size")]
    SaslFrameTooLarge(i64),
}

/// What authentication makes of a request.
enum Authenticated {
    /// A SASL request, answered here (encoded), maybe closing after a delay.
    Answer(Result<Bytes, ConnectionError>, Option<Duration>),
    /// Not allowed in the session's state: the connection closes.
    Refused(String),
    /// Allowed: dispatch it.
    Pass(Box<Request>),
}

/// Answers SaslHandshake and SaslAuthenticate from the session, and lets
/// through what the session allows.
fn authenticate(session: &mut Session, request: Request) -> Authenticated {
    let api_key = ApiKey::try_from(request.api_key()).expect("decoded requests have known keys");
    let version = request.api_version();
    let correlation_id = request.correlation_id();
    let (response, close) = match &request.body {
        RequestKind::SaslHandshake(r) => {
            let a = session.handshake(version, r);
            (ResponseKind::SaslHandshake(a.response), a.close_after)
        }
        RequestKind::SaslAuthenticate(r) => {
            let a = session.authenticate(version, r);
            (ResponseKind::SaslAuthenticate(a.response), a.close_after)
        }
        _ => {
            return match session.gate(api_key) {
                Gate::Pass => Authenticated::Pass(Box::new(request)),
                Gate::Close(reason) => Authenticated::Refused(reason),
            }
        }
    };
    let bytes = encode_response(api_key, version, correlation_id, &response)
        .map_err(|e| ConnectionError::Io(std::io::Error::other(e.to_string())));
    Authenticated::Answer(bytes, close)
}

/// The limits one connection's reader works within.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    pub max_frame_bytes: usize,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
}

impl ReadLimits {
    pub fn from_config(c: &crate::config::ServerConfig) -> Self {
        Self {
            max_frame_bytes: c.socket_request_max_bytes,
            read_timeout: Duration::from_millis(c.socket_request_read_timeout_ms),
            idle_timeout: Duration::from_millis(c.connections_max_idle_ms),
        }
    }
}

/// Whether the executor has work in progress, so the reader does not call
/// a connection idle while a long request (a long-poll fetch) runs.
struct Activity {
    started: Instant,
    outstanding: AtomicUsize,
    /// Milliseconds after `started` of the last answered request.
    last_answered_ms: AtomicU64,
    /// Milliseconds after `started` until which the connection is muted for
    /// a quota: nothing more is read from it until then.
    muted_until_ms: AtomicU64,
}

impl Activity {
    fn finished_one(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_answered_ms.store(ms, Ordering::Relaxed);
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Mutes the connection for `throttle` from now (never shortening a
    /// mute already set).
    fn mute_for(&self, throttle: Duration) -> Instant {
        let until = Instant::now() + throttle;
        let ms = (until - self.started).as_millis() as u64;
        self.muted_until_ms.fetch_max(ms, Ordering::SeqCst);
        until
    }

    /// When the connection's mute ends, if it is muted.
    fn muted_until(&self) -> Option<Instant> {
        let until =
            self.started + Duration::from_millis(self.muted_until_ms.load(Ordering::SeqCst));
        (until > Instant::now()).then_some(until)
    }

    /// When the connection became idle, if it is.
    fn idle_since(&self) -> Option<Instant> {
        if self.outstanding.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let ms = self.last_answered_ms.load(Ordering::Relaxed);
        Some(self.started + Duration::from_millis(ms))
    }
}

/// Serves one accepted connection: the TLS handshake first on an SSL or
/// SASL_SSL listener (bounded by `socket.request.read.timeout.ms`), then
/// requests until the client leaves, the connection fails, or shutdown.
pub async fn run(
    broker: Arc<Broker>,
    stream: TcpStream,
    listener: Arc<ListenerContext>,
    memory: Arc<MemoryBudget>,
    limits: ReadLimits,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let client_ip: Option<IpAddr> = stream.peer_addr().map(|a| a.ip()).ok();
    let Some(tls) = listener.tls.clone() else {
        let (read_half, write_half) = stream.into_split();
        let peer = Peer {
            ip: client_ip,
            tls_principal: None,
        };
        return serve(
            broker, read_half, write_half, peer, listener, memory, limits, shutdown,
        )
        .await;
    };
    let accepted = tokio::time::timeout(limits.read_timeout, tls.acceptor().accept(stream)).await;
    let stream = match accepted {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            metrics::counter!("kafka_broker_tls_handshake_failures_total", "listener" => listener.name.to_string())
                .increment(1);
            return Err(e.into());
        }
        Err(_) => {
            metrics::counter!("kafka_broker_tls_handshake_failures_total", "listener" => listener.name.to_string())
                .increment(1);
            return Err(ConnectionError::RequestReadTimeout {
                received: 0,
                size: 0,
            });
        }
    };
    // A certificate whose subject cannot be read, or that no mapping rule
    // maps, fails authentication, as in Kafka (it is not anonymous).
    let tls_principal = match crate::security::tls::peer_principal(stream.get_ref().1, &tls.mapper)
    {
        Ok(principal) => principal,
        Err(e) => {
            metrics::counter!("kafka_broker_tls_handshake_failures_total", "listener" => listener.name.to_string())
                    .increment(1);
            return Err(ConnectionError::Unauthenticated(e.to_string()));
        }
    };
    let (read_half, write_half) = tokio::io::split(stream);
    let peer = Peer {
        ip: client_ip,
        tls_principal,
    };
    serve(
        broker,
        super::stream::TlsSource::new(read_half),
        write_half,
        peer,
        listener,
        memory,
        limits,
        shutdown,
    )
    .await
}

/// The connection as each of its requests names it.
struct ClientAddr {
    /// `/` + IP, as Kafka reports a client's host.
    host: String,
    ip: Option<IpAddr>,
    /// Unique in the process.
    connection_id: u64,
}

/// Who is on the other end, as the transport knows it.
struct Peer {
    ip: Option<IpAddr>,
    /// The client certificate's principal name, on a TLS connection that
    /// presented one.
    tls_principal: Option<String>,
}

#[allow(clippy::too_many_arguments)]
async fn serve<R: ReadSource, W: ResponseSink>(
    broker: Arc<Broker>,
    read_half: R,
    write_half: W,
    peer: Peer,
    listener: Arc<ListenerContext>,
    memory: Arc<MemoryBudget>,
    limits: ReadLimits,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(0);
    let client = ClientAddr {
        host: peer.ip.map(|ip| format!("/{ip}")).unwrap_or_default(),
        ip: peer.ip,
        connection_id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
    };
    let mut session = Session::new(&broker, listener.clone(), peer.tls_principal);
    let authenticated = Arc::new(AtomicBool::new(session.authenticated()));
    let (tx, mut rx) =
        mpsc::channel::<Result<Frame, ConnectionError>>(broker.config.queued_max_requests);
    let activity = Arc::new(Activity {
        started: Instant::now(),
        outstanding: AtomicUsize::new(0),
        last_answered_ms: AtomicU64::new(0),
        muted_until_ms: AtomicU64::new(0),
    });
    let reader = tokio::spawn(
        Reader {
            rd: read_half,
            memory,
            limits,
            activity: activity.clone(),
            authenticated: authenticated.clone(),
            sasl_max_receive: broker.config.sasl_server_max_receive_size,
            raw_tokens: false,
            sasl_listener: listener.protocol.uses_sasl(),
        }
        .run(tx),
    );
    let mut out = BufWriter::with_capacity(64 * 1024, write_half);
    let result = loop {
        let frame = tokio::select! {
            f = rx.recv() => f,
            _ = shutdown.changed() => break Ok(()),
        };
        let Frame {
            inbound,
            charge,
            frame_bytes,
        } = match frame {
            None => break Ok(()),
            Some(Err(e)) => break Err(e),
            Some(Ok(f)) => f,
        };
        let mut close_after = None;
        let mut throttle = Throttle::default();
        let reply = match inbound {
            Inbound::Answer(bytes) => Ok(Some(Outgoing::Frame(bytes))),
            Inbound::SaslToken(token) => {
                let answer = session.raw_token(&token);
                close_after = answer.close_after;
                authenticated.store(session.authenticated(), Ordering::SeqCst);
                Ok(answer.response.map(|bytes| {
                    let mut framed = BytesMut::with_capacity(4 + bytes.len());
                    framed.put_i32(bytes.len() as i32);
                    framed.put_slice(&bytes);
                    Outgoing::Frame(framed.freeze())
                }))
            }
            Inbound::Request(request) => match authenticate(&mut session, request) {
                Authenticated::Answer(bytes, close) => {
                    close_after = close;
                    authenticated.store(session.authenticated(), Ordering::SeqCst);
                    bytes.map(|b| Some(Outgoing::Frame(b)))
                }
                Authenticated::Refused(reason) => {
                    metrics::counter!("kafka_broker_unauthenticated_requests_total").increment(1);
                    Err(ConnectionError::Unauthenticated(reason))
                }
                Authenticated::Pass(request) => handle_request(
                    &broker,
                    &listener,
                    session.principal(),
                    &client,
                    *request,
                    frame_bytes,
                )
                .await
                .map(|handled| {
                    throttle = handled.throttle;
                    handled.response
                }),
            },
        };
        if throttle.before_response && !throttle.time.is_zero() {
            // An older client does not back off by itself: its response is
            // held back for the throttle time, the connection muted.
            let until = activity.mute_for(throttle.time);
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = shutdown.changed() => break Ok(()),
            }
        }
        match reply {
            Ok(Some(response)) => {
                write_response(&mut out, response).await?;
                // Flush unless more requests are already waiting: their
                // responses then go out in one write.
                if rx.is_empty() {
                    out.flush().await?;
                }
            }
            Ok(None) => {}
            Err(e) => {
                out.flush().await.ok();
                break Err(e);
            }
        }
        if let Some(delay) = close_after {
            // A failed authentication (or a SASL request out of turn): the
            // answer goes out, and the connection closes after Kafka's
            // connection.failed.authentication.delay.ms.
            out.flush().await.ok();
            tokio::time::sleep(delay).await;
            break Err(ConnectionError::Unauthenticated(
                "SASL authentication failed or out of turn".into(),
            ));
        }
        drop(charge);
        activity.finished_one();
        if !throttle.before_response && !throttle.time.is_zero() {
            // KIP-219: the response went out at once carrying
            // throttle_time_ms; the connection stays muted for that time
            // (the next request is neither read nor executed).
            out.flush().await?;
            let until = activity.mute_for(throttle.time);
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = shutdown.changed() => break Ok(()),
            }
        }
    };
    reader.abort();
    broker
        .share_leaders
        .close_connection(&broker, client.connection_id)
        .await;
    result
}

/// Reads size-prefixed frames, charging the memory budget as their bytes
/// arrive, and walks and decodes them.
struct Reader<R> {
    rd: R,
    /// Until the session authenticates, frames are bounded by
    /// `sasl.server.max.receive.size` instead.
    authenticated: Arc<AtomicBool>,
    sasl_max_receive: usize,
    /// After a SaslHandshake v0 on a SASL listener: frames are bare tokens
    /// until the session authenticates.
    raw_tokens: bool,
    sasl_listener: bool,
    memory: Arc<MemoryBudget>,
    limits: ReadLimits,
    activity: Arc<Activity>,
}

impl<R: ReadSource> Reader<R> {
    async fn run(mut self, tx: mpsc::Sender<Result<Frame, ConnectionError>>) {
        loop {
            let frame = match self.next_frame().await {
                Ok(Some(frame)) => frame,
                Ok(None) => return,
                Err(e) => {
                    match &e {
                        ConnectionError::Idle => {
                            metrics::counter!("kafka_broker_connection_timeouts_total", "reason" => "idle")
                                .increment(1)
                        }
                        ConnectionError::RequestReadTimeout { .. } => {
                            metrics::counter!("kafka_broker_connection_timeouts_total", "reason" => "request_read")
                                .increment(1)
                        }
                        ConnectionError::FrameTooLarge(_) => {
                            metrics::counter!("kafka_broker_requests_too_large_total", "limit" => "socket.request.max.bytes")
                                .increment(1)
                        }
                        ConnectionError::DecodedTooLarge { .. } => {
                            metrics::counter!("kafka_broker_requests_too_large_total", "limit" => "queued.max.request.bytes")
                                .increment(1)
                        }
                        ConnectionError::Request(_) => {
                            metrics::counter!("kafka_broker_malformed_requests_total").increment(1);
                            tracing::info!(error = %e, "closing connection on a request we cannot answer");
                        }
                        ConnectionError::SaslFrameTooLarge(_) => {
                            metrics::counter!("kafka_broker_requests_too_large_total", "limit" => "sasl.server.max.receive.size")
                                .increment(1)
                        }
                        ConnectionError::Io(_) | ConnectionError::Unauthenticated(_) => {}
                    }
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            self.activity.outstanding.fetch_add(1, Ordering::SeqCst);
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
    }

    /// The next request, or `None` at a clean end of stream between frames.
    async fn next_frame(&mut self) -> Result<Option<Frame>, ConnectionError> {
        // A connection throttled for a quota is muted: its next request
        // stays in the socket (and its sender's buffers) until the throttle
        // ends, as Kafka mutes a throttled channel.
        while let Some(until) = self.activity.muted_until() {
            tokio::time::sleep_until(until).await;
        }
        let mut prefix = [0u8; 4];
        let got = self.read_prefix_start(&mut prefix).await?;
        if got == 0 {
            return Ok(None);
        }
        // From the first byte on, the whole request runs against one deadline.
        let deadline = Instant::now() + self.limits.read_timeout;
        if got < prefix.len() {
            match tokio::time::timeout_at(deadline, self.rd.read_exact(&mut prefix[got..])).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(ConnectionError::RequestReadTimeout {
                        received: 0,
                        size: 0,
                    })
                }
            }
        }
        let size = i32::from_be_bytes(prefix) as i64;
        if size < 0 || size as usize > self.limits.max_frame_bytes {
            return Err(ConnectionError::FrameTooLarge(size));
        }
        if !self.authenticated.load(Ordering::SeqCst) && size as usize > self.sasl_max_receive {
            return Err(ConnectionError::SaslFrameTooLarge(size));
        }
        let size = size as usize;
        let mut charge = Charge::new(self.memory.clone());
        let body = self.read_body(size, &mut charge, deadline).await?;
        if self.raw_tokens {
            if !self.authenticated.load(Ordering::SeqCst) {
                return Ok(Some(Frame {
                    inbound: Inbound::SaslToken(body),
                    charge,
                    frame_bytes: size,
                }));
            }
            self.raw_tokens = false;
        }
        crate::fuzzing::capture_frame(&body);

        let inbound = match check_request(body.clone()) {
            Ok(checked) => {
                let decoded = checked.decoded_bytes();
                if size as u64 + decoded > self.memory.limit_bytes() as u64 {
                    return Err(ConnectionError::DecodedTooLarge {
                        frame_bytes: size,
                        decoded_bytes: decoded,
                        limit_bytes: self.memory.limit_bytes(),
                    });
                }
                charge.take(decoded as usize, deadline).await.map_err(|_| {
                    ConnectionError::RequestReadTimeout {
                        received: size,
                        size,
                    }
                })?;
                let request = checked.decode()?;
                // A v0 handshake's tokens follow as bare frames (the
                // executor closes the connection if it refuses the handshake).
                self.raw_tokens = self.sasl_listener
                    && request.api_key() == ApiKey::SaslHandshake as i16
                    && request.api_version() == 0;
                Inbound::Request(request)
            }
            // Produce v0-2 are advertised for librdkafka's sake and refused
            // per partition (KAFKA-18659).
            Err(RequestError::UnsupportedVersion {
                api_key: ApiKey::Produce,
                ..
            }) => Inbound::Answer(unsupported_produce_response(&body)?),
            Err(RequestError::UnsupportedVersion {
                api_key: ApiKey::ApiVersions,
                correlation_id,
                ..
            }) => Inbound::Answer(unsupported_api_versions_response(correlation_id)),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(Frame {
            inbound,
            charge,
            frame_bytes: size,
        }))
    }

    /// Waits for the first bytes of a frame's size prefix and returns how
    /// many arrived (0 at a clean end of stream). Between requests the
    /// connection may idle for `connections.max.idle.ms`, counted from the
    /// later of the last request read and the last one answered; a request
    /// in progress is not idleness.
    async fn read_prefix_start(&mut self, prefix: &mut [u8; 4]) -> Result<usize, ConnectionError> {
        let idle = self.limits.idle_timeout;
        let mut idle_deadline = Instant::now() + idle;
        loop {
            tokio::select! {
                biased;
                n = self.rd.read(prefix) => return Ok(n?),
                _ = tokio::time::sleep_until(idle_deadline) => {
                    match self.activity.idle_since() {
                        Some(since) if since + idle <= Instant::now() => {
                            return Err(ConnectionError::Idle)
                        }
                        Some(since) => idle_deadline = since + idle,
                        None => idle_deadline = Instant::now() + idle,
                    }
                }
            }
        }
    }

    /// Reads `size` body bytes, taking budget for each read before it is
    /// made and giving back what the read did not fill. The buffer is
    /// allocated only once bytes are there to fill it.
    async fn read_body(
        &mut self,
        size: usize,
        charge: &mut Charge,
        deadline: Instant,
    ) -> Result<Bytes, ConnectionError> {
        let mut body = BytesMut::new();
        let timed_out = |received| ConnectionError::RequestReadTimeout { received, size };
        while body.len() < size {
            tokio::select! {
                biased;
                ready = self.rd.readable() => ready?,
                _ = tokio::time::sleep_until(deadline) => return Err(timed_out(body.len())),
            }
            if body.len() == body.capacity() {
                // Read into spare capacity: zeroing the buffer first (as
                // `BytesMut::zeroed` would) cost a memset of every request
                // byte, 5% of the broker's CPU under produce load.
                let target = if size <= EAGER_FRAME_BYTES {
                    size
                } else {
                    size.min(body.len().saturating_mul(2).max(EAGER_FRAME_BYTES))
                };
                body.reserve(target - body.len());
            }
            let want = (size - body.len())
                .min(body.capacity() - body.len())
                .min(MAX_READ_BYTES);
            charge
                .take(want, deadline)
                .await
                .map_err(|_| timed_out(body.len()))?;
            match self.rd.try_read_buf(&mut (&mut body).limit(want)) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => charge.give_back(want - n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => charge.give_back(want),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(body.freeze())
    }
}

/// An encoded response: one frame, or (Fetch) the parts of one frame.
enum Outgoing {
    Frame(Bytes),
    Parts(Vec<Part<FetchedRecords>>),
}

/// How long a client over a quota is held back.
#[derive(Default)]
struct Throttle {
    time: Duration,
    /// An older request version: the broker delays the response itself.
    before_response: bool,
}

/// A handled request: its encoded response (`None`: none is due, acks=0)
/// and the throttle its client earned.
struct Handled {
    response: Option<Outgoing>,
    throttle: Throttle,
}

/// Dispatches one decoded request, applies the client's quotas and encodes
/// its response. `Err`: the connection must close.
async fn handle_request(
    broker: &Broker,
    listener: &ListenerContext,
    principal: &Arc<str>,
    client: &ClientAddr,
    request: Request,
    frame_bytes: usize,
) -> Result<Handled, ConnectionError> {
    let started = std::time::Instant::now();
    let api_key = ApiKey::try_from(request.api_key()).expect("decoded requests have known keys");
    let version = request.api_version();
    let correlation_id = request.correlation_id();
    let key_label = format!("{api_key:?}");
    let ctx = RequestContext {
        client_id: request
            .header
            .client_id
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default(),
        client_host: client.host.clone(),
        client_ip: client.ip,
        listener: listener.name.clone(),
        principal: principal.clone(),
        connection_id: client.connection_id,
    };
    let quota_usage = crate::quota::usage::before(broker, api_key, version, &request.body);
    // With quotas on, the handler's busy time is measured for request_percentage.
    let (mut reply, busy) = if quota_usage.quotas_on() {
        crate::quota::usage::Busy::new(dispatch(broker, &ctx, version, request.body, request.newer))
            .await
    } else {
        (
            dispatch(broker, &ctx, version, request.body, request.newer).await,
            Duration::ZERO,
        )
    };
    let throttle_ms = crate::quota::usage::after(
        broker,
        &ctx,
        api_key,
        quota_usage,
        &mut reply,
        frame_bytes,
        busy,
    );
    let encoding_failed = |e: protocol::EncodeError| {
        tracing::error!(error = %e, "response encoding failed");
        metrics::counter!("kafka_broker_request_errors_total", "api" => key_label.clone())
            .increment(1);
        ConnectionError::Io(std::io::Error::other(e.to_string()))
    };
    let result = match reply {
        Reply::Respond(resp) => encode_response(api_key, version, correlation_id, &resp)
            .map(|bytes| Some(Outgoing::Frame(bytes)))
            .map_err(encoding_failed),
        Reply::Newer(resp) => protocol::newer::encode_newer_response(version, correlation_id, resp)
            .map(|bytes| Some(Outgoing::Frame(bytes)))
            .map_err(encoding_failed),
        Reply::Fetch(fetch) => {
            encode_fetch_response(version, correlation_id, &fetch.response, fetch.records)
                .map(|parts| Some(Outgoing::Parts(parts)))
                .map_err(encoding_failed)
        }
        Reply::NoResponse => Ok(None),
        Reply::Unsupported => Err(ConnectionError::Io(std::io::Error::other(format!(
            "{api_key:?} reached dispatch but has no handler"
        )))),
    };
    metrics::counter!("kafka_broker_requests_total", "api" => key_label.clone(), "version" => version.to_string())
        .increment(1);
    metrics::histogram!("kafka_broker_request_latency_seconds", "api" => key_label)
        .record(started.elapsed().as_secs_f64());
    result.map(|response| Handled {
        response,
        throttle: Throttle {
            time: Duration::from_millis(throttle_ms),
            before_response: !crate::quota::client_throttles(api_key, version),
        },
    })
}

/// Writes one response. Encoded bytes are buffered; record regions are sent
/// from their files after the buffer is flushed, so the order on the wire is
/// the parts' order.
async fn write_response<W: ResponseSink>(
    out: &mut BufWriter<W>,
    response: Outgoing,
) -> std::io::Result<()> {
    let parts = match response {
        Outgoing::Frame(bytes) => return out.write_all(&bytes).await,
        Outgoing::Parts(parts) => parts,
    };
    for part in parts {
        match part {
            Part::Encoded(bytes) => out.write_all(&bytes).await?,
            Part::Records(records) => {
                out.flush().await?;
                for region in &records.regions {
                    out.get_mut().send_region(region).await?;
                }
            }
        }
    }
    Ok(())
}

/// A region shorter on disk than when it was taken: its segment was
/// truncated (a follower cutting a diverged tail) while the response was
/// being sent. The frame's size is already on the wire, so the connection
/// closes, as Kafka's `FileRecords.writeTo` does; the client fetches again.
fn truncated_under_send() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "segment file truncated while its records were being sent",
    )
}

/// Sends a file region with `sendfile(2)`: the kernel copies from the page
/// cache to the socket. Falls back to [`copy_region`] where the file system
/// cannot (EINVAL/ENOSYS before any byte went out).
#[cfg(target_os = "linux")]
pub(super) async fn send_region(
    out: &mut OwnedWriteHalf,
    region: &FileRegion,
) -> std::io::Result<()> {
    use tokio::io::Interest;
    // Linux sends at most 0x7ffff000 bytes per call.
    const MAX_SENDFILE: u64 = 0x7fff_f000;
    let stream: &TcpStream = out.as_ref();
    let mut offset = region.position();
    let end = region.position() + region.len();
    while offset < end {
        stream.writable().await?;
        let count = (end - offset).min(MAX_SENDFILE) as usize;
        let sent = stream.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(stream, region.file(), Some(&mut offset), count)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => return Err(truncated_under_send()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e)
                if offset == region.position()
                    && matches!(
                        rustix::io::Errno::from_io_error(&e),
                        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS)
                    ) =>
            {
                return copy_region(out, region).await;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
pub(super) async fn send_region(
    out: &mut OwnedWriteHalf,
    region: &FileRegion,
) -> std::io::Result<()> {
    copy_region(out, region).await
}

/// Sends a file region through a bounded buffer: read a piece, write it.
pub(super) async fn copy_region<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    region: &FileRegion,
) -> std::io::Result<()> {
    const PIECE_BYTES: u64 = 64 * 1024;
    let mut buf = vec![0u8; region.len().min(PIECE_BYTES) as usize];
    let mut done = 0u64;
    while done < region.len() {
        let n = (region.len() - done).min(PIECE_BYTES) as usize;
        region
            .read_exact_at(&mut buf[..n], done)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => truncated_under_send(),
                _ => e,
            })?;
        out.write_all(&buf[..n]).await?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair: the broker's write half, and the client's stream.
    async fn connected() -> (OwnedWriteHalf, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_, write) = server.into_split();
        (write, client)
    }

    fn file_with(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        (f, bytes)
    }

    /// Sends the region with `how`, then closes, and returns what the client
    /// read and what the send returned.
    async fn send_with(region: FileRegion, sendfile: bool) -> (Vec<u8>, std::io::Result<()>) {
        let (mut write, mut client) = connected().await;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let sent = if sendfile {
            send_region(&mut write, &region).await
        } else {
            copy_region(&mut write, &region).await
        };
        drop(write);
        (reader.await.unwrap(), sent)
    }

    #[tokio::test]
    async fn a_region_goes_out_byte_for_byte_either_way() {
        // Larger than a socket buffer, so the send meets a full socket.
        let (f, bytes) = file_with(3 << 20);
        let file = Arc::new(f.reopen().unwrap());
        for sendfile in [true, false] {
            let region = FileRegion::new(file.clone(), 1000, 2 << 20);
            let (got, sent) = send_with(region, sendfile).await;
            sent.unwrap();
            assert!(got == bytes[1000..1000 + (2 << 20)], "sendfile {sendfile}");
        }
    }

    #[tokio::test]
    async fn a_region_truncated_under_the_send_fails_the_connection() {
        for sendfile in [true, false] {
            let (f, bytes) = file_with(300_000);
            let file = Arc::new(f.reopen().unwrap());
            let region = FileRegion::new(file.clone(), 1000, 200_000);
            file.set_len(51_000).unwrap();
            let (got, sent) = send_with(region, sendfile).await;
            let e = sent.expect_err("a short file cannot fill the frame");
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
            // Only bytes of the region went out, never anything else.
            assert!(got.len() <= 50_000);
            assert!(got == bytes[1000..1000 + got.len()], "sendfile {sendfile}");
        }
    }
}
