//! TLS for the dispatcher's listeners (rustls, ring provider): the server
//! configuration from PEM files, and accepting connections with the
//! handshakes off the accept loop, for axum (a [`TlsListener`]) and tonic
//! (a stream of [`TlsConnection`]s).
//!
//! Invariant: no plaintext connection is ever handed on from a listener made
//! here; a failed handshake is logged at debug and dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A TLS handshake that takes longer than this is dropped (a client that
/// connects and says nothing holds no more than a task this long).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPTED_BACKLOG: usize = 64;

/// Makes ring the process's rustls provider (for the clients that take the
/// default: reqwest's, tonic's). Idempotent; a provider installed before
/// (by an embedding program) is kept. reqwest is built without a provider
/// of its own (no aws-lc), so every reqwest client, even one that only
/// speaks http://, needs this first: building one without it panics.
pub fn install_ring_provider() {
    let _ = ring_provider().install_default();
}

/// rustls's ring provider. rustls deprecates it for lacking post-quantum key
/// exchange; the dispatcher uses it anyway, as the broker does, to avoid
/// aws-lc's C and CMake build.
#[allow(deprecated)]
fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The certificates of a PEM file.
pub fn load_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no CERTIFICATE in the file", path.display());
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// A root store of the CA certificates in a PEM file.
pub fn load_roots(path: &Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// Whether the clients of a listener must show a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// mTLS: a client without a certificate signed by the CA is refused in
    /// the handshake.
    Required,
    /// A certificate is checked when shown; a client may show none.
    Optional,
}

/// A server configuration: `cert` (the chain, leaf first) and `key`; with
/// `client_ca`, client certificates are verified against it.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<(&Path, ClientAuth)>,
    alpn: &[&[u8]],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(ring_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some((ca, auth)) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider);
            let verifier = match auth {
                ClientAuth::Required => verifier,
                ClientAuth::Optional => verifier.allow_unauthenticated(),
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
    };
    let mut config = builder
        .with_single_cert(load_certs(cert)?, load_key(key)?)
        .map_err(|e| anyhow::anyhow!("{} and {}: {e}", cert.display(), key.display()))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A client configuration trusting the CAs of `ca` (the web PKI is not
/// trusted then) and, with `identity`, showing that certificate and key.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(ring_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(load_roots(ca)?);
    Ok(match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| anyhow::anyhow!("{} and {}: {e}", cert.display(), key.display()))?,
    })
}

/// Accepts TCP connections on `listener` and hands on the ones whose TLS
/// handshake completed, each handshake in a task of its own.
fn spawn_acceptor(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (tx, rx) = mpsc::channel(ACCEPTED_BACKLOG);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait, as axum's own loop does.
                        tracing::warn!("accepting a TLS connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

/// An axum listener serving TLS.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(TlsListener {
            accepted: spawn_acceptor(listener, config),
            local,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The acceptor task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The TLS connections of `listener`, as tonic's `serve_with_incoming` takes them.
pub fn tls_incoming(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> AcceptedStream {
    AcceptedStream(tokio_stream::wrappers::ReceiverStream::new(spawn_acceptor(
        listener, config,
    )))
}

/// [`tls_incoming`]'s stream.
pub struct AcceptedStream(
    tokio_stream::wrappers::ReceiverStream<(TlsStream<TcpStream>, SocketAddr)>,
);

impl tokio_stream::Stream for AcceptedStream {
    type Item = io::Result<TlsConnection>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|next| next.map(|(stream, peer)| Ok(TlsConnection { stream, peer })))
    }
}

/// One TLS connection to the gRPC listener.
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    peer: SocketAddr,
}

/// What a gRPC handler learns of its TLS connection (a request extension).
#[derive(Debug, Clone)]
pub struct TlsConnectInfo {
    pub peer: SocketAddr,
}

impl tonic::transport::server::Connected for TlsConnection {
    type ConnectInfo = TlsConnectInfo;

    fn connect_info(&self) -> TlsConnectInfo {
        TlsConnectInfo { peer: self.peer }
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
