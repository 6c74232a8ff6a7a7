//! Peer addresses, and the Kafka-protocol client connection to a peer
//! broker ([`PeerConn`]). Besides authenticating on a secured inter-broker
//! or controller listener, a peer is recognised by the address its
//! connection comes from: a
//! follower's replica fetches must come from an address its registered host
//! resolves to, and the controller listener serves only the voters' hosts.
//! So a node also connects to its peers *from* its own advertised address
//! ([`connect_from`]), which on a one-host cluster (nodes on 127.0.0.2,
//! 127.0.0.3, ...) is not the address the kernel would pick.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpSocket, TcpStream};

/// How long a host name's addresses are trusted before they are looked up
/// again; a failed lookup is retried after [`FAILED_LOOKUP_TTL`].
const LOOKUP_TTL: Duration = Duration::from_secs(30);
const FAILED_LOOKUP_TTL: Duration = Duration::from_secs(1);
/// Host names are those of registered brokers and voters; the cap only
/// guards against a registration storm.
const MAX_CACHED_HOSTS: usize = 1024;

type Cache = Mutex<HashMap<String, (Instant, Arc<[IpAddr]>)>>;

fn cache() -> &'static Cache {
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The addresses `host` stands for: itself when it is an IP literal,
/// otherwise what it resolves to (cached). IPv4-mapped IPv6 addresses are
/// given as IPv4, as a dual-stack listener's peers should be compared.
pub async fn resolve(host: &str) -> Arc<[IpAddr]> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Arc::from([ip.to_canonical()]);
    }
    if let Some((at, ips)) = cache().lock().expect("poisoned").get(host) {
        let ttl = if ips.is_empty() {
            FAILED_LOOKUP_TTL
        } else {
            LOOKUP_TTL
        };
        if at.elapsed() < ttl {
            return ips.clone();
        }
    }
    let ips: Arc<[IpAddr]> = match tokio::net::lookup_host((host, 0)).await {
        Ok(addrs) => addrs.map(|a| a.ip().to_canonical()).collect(),
        Err(e) => {
            tracing::warn!(host, error = %e, "cannot resolve a peer's host");
            Arc::from([])
        }
    };
    let mut cache = cache().lock().expect("poisoned");
    if cache.len() >= MAX_CACHED_HOSTS {
        cache.clear();
    }
    cache.insert(host.to_string(), (Instant::now(), ips.clone()));
    ips
}

/// Whether a connection from `ip` may be from `host`.
pub async fn is_address_of(host: &str, ip: IpAddr) -> bool {
    resolve(host).await.contains(&ip.to_canonical())
}

/// Connects to `dest` (`host:port`) from `source_host`'s address of the same
/// family, when it has one that can reach `dest` (both loopback or both
/// not); otherwise from whatever address the kernel picks.
pub async fn connect_from(dest: &str, source_host: Option<&str>) -> std::io::Result<TcpStream> {
    let mut last_error = None;
    for dest in tokio::net::lookup_host(dest).await? {
        let source = match source_host {
            Some(h) => resolve(h).await.iter().copied().find(|ip| {
                ip.is_ipv4() == dest.is_ipv4()
                    && ip.is_loopback() == dest.ip().is_loopback()
                    && !ip.is_unspecified()
            }),
            None => None,
        };
        match connect_one(dest, source).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error
        .unwrap_or_else(|| std::io::Error::other(format!("{dest} resolves to no address"))))
}

async fn connect_one(dest: SocketAddr, source: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let socket = if dest.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(source) = source {
        // An outgoing socket bound to this node's address holds its
        // ephemeral port the way a listener holds its own. Without
        // SO_REUSEADDR, a long-lived peer connection that drew port P would
        // stop any listener (this process's after a restart, or another
        // node's sharing the address) from binding P; with it, only a
        // listener on P blocks, as for an unbound socket.
        socket.set_reuseaddr(true)?;
        if let Err(e) = socket.bind(SocketAddr::new(source, 0)) {
            // Not an address of this host: peers will not recognise this
            // connection, but it is the best there is.
            tracing::warn!(%source, error = %e, "cannot connect from this node's advertised address");
            return TcpStream::connect(dest).await;
        }
    }
    socket.connect(dest).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn literals_and_names_resolve() {
        assert_eq!(
            &*resolve("127.0.0.2").await,
            &["127.0.0.2".parse::<IpAddr>().unwrap()]
        );
        assert!(is_address_of("127.0.0.2", "::ffff:127.0.0.2".parse().unwrap()).await);
        assert!(!is_address_of("127.0.0.2", "127.0.0.1".parse().unwrap()).await);
        assert!(is_address_of("localhost", "127.0.0.1".parse().unwrap()).await);
    }

    #[tokio::test]
    async fn connections_come_from_the_source_hosts_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dest = listener.local_addr().unwrap().to_string();
        let connect = tokio::spawn(async move { connect_from(&dest, Some("127.0.0.3")).await });
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), "127.0.0.3".parse::<IpAddr>().unwrap());
        connect.await.unwrap().unwrap();
        // No source host: the kernel's choice.
        let dest = listener.local_addr().unwrap().to_string();
        let connect = tokio::spawn(async move { connect_from(&dest, None).await });
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(peer.ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
        connect.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn an_outgoing_connections_port_stays_free_for_a_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dest = listener.local_addr().unwrap().to_string();
        let connect = tokio::spawn(async move { connect_from(&dest, Some("127.0.0.4")).await });
        let (_accepted, _) = listener.accept().await.unwrap();
        let outgoing = connect.await.unwrap().unwrap();
        let taken = outgoing.local_addr().unwrap();
        assert_eq!(taken.ip(), "127.0.0.4".parse::<IpAddr>().unwrap());
        // While that connection lives, a listener binds the same address and
        // port (tokio's listeners set SO_REUSEADDR, as the broker's do).
        let second = tokio::net::TcpListener::bind(taken).await;
        assert!(second.is_ok(), "{taken}: {:?}", second.err());
    }
}

/// Why a request to a peer broker failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
}

/// A client connection to a peer broker's inter-broker listener (TLS and a
/// SASL login first when that listener speaks them): one request at a
/// time, each under `timeout`, a response larger than `max_response`
/// refused before it is read.
pub struct PeerConn {
    pub stream: crate::security::peer::PeerStream,
    pub correlation_id: i32,
    pub client_id: kafka_protocol::protocol::StrBytes,
    pub max_response: usize,
    pub timeout: Duration,
    security: std::sync::Arc<crate::security::peer::PeerSecurity>,
    /// When the SASL session the peer granted (KIP-368's
    /// `session_lifetime_ms`) must be renewed: at 90% of its lifetime, as
    /// Java's client re-authenticates between 85% and 95%.
    reauthenticate_at: Option<std::time::Instant>,
}

impl PeerConn {
    /// Connects to `addr` from `own_host`'s address, with TLS and a SASL
    /// login as `security` says (SaslHandshake v1 and SaslAuthenticate v2,
    /// as Java's client), all within `connect_timeout`.
    pub async fn open(
        addr: &str,
        own_host: Option<&str>,
        security: &std::sync::Arc<crate::security::peer::PeerSecurity>,
        client_id: kafka_protocol::protocol::StrBytes,
        max_response: usize,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<PeerConn, CallError> {
        let open = async {
            let tcp = connect_from(addr, own_host).await?;
            tcp.set_nodelay(true)?;
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let stream = security.secure(tcp, host).await?;
            let mut conn = PeerConn {
                stream,
                correlation_id: 0,
                client_id,
                max_response,
                timeout,
                security: security.clone(),
                reauthenticate_at: None,
            };
            if let Some((mechanism, client)) = security.sasl_client() {
                conn.authenticate(mechanism, client).await?;
            }
            Ok(conn)
        };
        tokio::time::timeout(connect_timeout, open)
            .await
            .map_err(|_| CallError::Protocol(format!("connecting to {addr} timed out")))?
    }

    async fn authenticate(
        &mut self,
        mechanism: crate::security::sasl::Mechanism,
        mut client: Box<dyn crate::security::sasl::ClientAuthenticator>,
    ) -> Result<(), CallError> {
        use crate::security::sasl::ClientStep;
        use kafka_protocol::messages::{
            ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
            SaslHandshakeResponse,
        };
        let refused = |what: String| CallError::Protocol(format!("SASL {mechanism}: {what}"));
        let handshake: SaslHandshakeResponse = self
            .exchange(
                ApiKey::SaslHandshake,
                1,
                &SaslHandshakeRequest::default().with_mechanism(
                    kafka_protocol::protocol::StrBytes::from_static_str(mechanism.name()),
                ),
            )
            .await?;
        if handshake.error_code != 0 {
            return Err(refused(format!(
                "handshake refused (error {}; the peer enables {:?})",
                handshake.error_code,
                handshake
                    .mechanisms
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
            )));
        }
        let mut token = client.initial();
        // PLAIN takes one round and SCRAM two; a peer that wants more is not
        // one of ours.
        for _ in 0..4 {
            let resp: SaslAuthenticateResponse = self
                .exchange(
                    ApiKey::SaslAuthenticate,
                    2,
                    &SaslAuthenticateRequest::default().with_auth_bytes(token.into()),
                )
                .await?;
            if resp.error_code != 0 {
                return Err(refused(format!(
                    "authentication failed: {}",
                    resp.error_message.as_deref().unwrap_or("")
                )));
            }
            match client.step(&resp.auth_bytes).map_err(refused)? {
                ClientStep::Send(next) => token = next,
                ClientStep::Done => {
                    self.reauthenticate_at = (resp.session_lifetime_ms > 0).then(|| {
                        std::time::Instant::now()
                            + Duration::from_millis(resp.session_lifetime_ms as u64 * 9 / 10)
                    });
                    return Ok(());
                }
            }
        }
        Err(refused("the exchange does not end".into()))
    }

    /// One request and its response; first a new SASL login on this
    /// connection when the session the peer granted is near its end
    /// (KIP-368), so the peer never closes the connection for it.
    pub async fn call<Req, Resp>(
        &mut self,
        key: kafka_protocol::messages::ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp, CallError>
    where
        Req: kafka_protocol::protocol::Encodable,
        Resp: kafka_protocol::protocol::Decodable,
    {
        if self
            .reauthenticate_at
            .is_some_and(|at| std::time::Instant::now() >= at)
        {
            if let Some((mechanism, client)) = self.security.sasl_client() {
                self.authenticate(mechanism, client).await?;
            }
        }
        self.exchange(key, version, req).await
    }

    async fn exchange<Req, Resp>(
        &mut self,
        key: kafka_protocol::messages::ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp, CallError>
    where
        Req: kafka_protocol::protocol::Encodable,
        Resp: kafka_protocol::protocol::Decodable,
    {
        use bytes::BytesMut;
        use kafka_protocol::messages::{RequestHeader, ResponseHeader};
        use kafka_protocol::protocol::{Decodable, Encodable};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        self.correlation_id = self.correlation_id.wrapping_add(1);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[0u8; 4]);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()))
            .encode(&mut buf, key.request_header_version(version))
            .map_err(|e| CallError::Protocol(e.to_string()))?;
        req.encode(&mut buf, version)
            .map_err(|e| CallError::Protocol(e.to_string()))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let exchange = async {
            self.stream.write_all(&buf).await?;
            let mut size = [0u8; 4];
            self.stream.read_exact(&mut size).await?;
            let size = i32::from_be_bytes(size);
            if size < 0 || size as usize > self.max_response {
                return Err(CallError::Protocol(format!(
                    "response of {size} bytes exceeds the {} allowed",
                    self.max_response
                )));
            }
            let mut body = vec![0u8; size as usize];
            self.stream.read_exact(&mut body).await?;
            Ok(bytes::Bytes::from(body))
        };
        let mut body = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| CallError::Protocol("request timed out".into()))??;
        let header = ResponseHeader::decode(&mut body, key.response_header_version(version))
            .map_err(|e| CallError::Protocol(e.to_string()))?;
        if header.correlation_id != self.correlation_id {
            return Err(CallError::Protocol("correlation id mismatch".into()));
        }
        Resp::decode(&mut body, version).map_err(|e| CallError::Protocol(e.to_string()))
    }
}

type PeerSlot = Arc<tokio::sync::Mutex<Option<PeerConn>>>;

/// Connections from this broker to its peers' inter-broker listeners, one
/// per peer and purpose (so that, say, transaction markers never queue
/// behind share-state writes), opened on first use and dropped after a
/// failed call so the next one reconnects.
pub struct PeerPool {
    conns: Mutex<HashMap<(crate::types::NodeId, &'static str), PeerSlot>>,
    request_timeout: Duration,
    connect_timeout: Duration,
}

impl PeerPool {
    pub fn new(request_timeout: Duration, connect_timeout: Duration) -> Self {
        PeerPool {
            conns: Mutex::new(HashMap::new()),
            request_timeout,
            connect_timeout,
        }
    }

    /// One request to `node`, over the connection kept for `purpose`.
    pub async fn call<Req, Resp>(
        &self,
        broker: &crate::broker::Broker,
        node: crate::types::NodeId,
        purpose: &'static str,
        key: kafka_protocol::messages::ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp, CallError>
    where
        Req: kafka_protocol::protocol::Encodable,
        Resp: kafka_protocol::protocol::Decodable,
    {
        let slot = {
            let mut conns = self.conns.lock().expect("poisoned");
            conns.entry((node, purpose)).or_default().clone()
        };
        let mut conn = slot.lock().await;
        if conn.is_none() {
            let image = broker.metadata.image();
            let addr = image
                .brokers
                .get(&node)
                .map(|b| format!("{}:{}", b.host, b.port))
                .ok_or_else(|| CallError::Protocol(format!("no address for {node}")))?;
            let own = image.brokers.get(&broker.node_id()).map(|b| b.host.clone());
            *conn = Some(
                PeerConn::open(
                    &addr,
                    own.as_deref(),
                    &broker.inter_broker_security,
                    kafka_protocol::protocol::StrBytes::from_string(format!(
                        "broker-{}-{purpose}",
                        broker.node_id()
                    )),
                    1 << 20,
                    self.request_timeout,
                    self.connect_timeout,
                )
                .await?,
            );
        }
        let c = conn.as_mut().expect("connected above");
        let result = c.call(key, version, req).await;
        if result.is_err() {
            *conn = None;
        }
        result
    }
}
