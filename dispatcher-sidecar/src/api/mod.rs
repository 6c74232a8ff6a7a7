//! The dispatcher's pull API (issue 7): HTTP/JSON (axum, described by
//! `openapi.yaml`) and gRPC (tonic, `proto/dispatcher.proto`), both thin
//! translations onto a [`QueueService`].
//!
//! Entry points:
//! - [`serve`] binds both listeners and serves until the shutdown future
//!   resolves; [`serve_bound`] does the same but returns at once with the
//!   bound addresses ([`Servers`]), so a caller can listen on port 0 and
//!   learn the ports.
//! - [`http_router`] and [`grpc_service`] build the two services without
//!   binding anything, for tests and for a layer that wraps them.
//!
//! Invariant: this module decides nothing about queues. It checks requests
//! against the limits in [`crate::service`] (so an over-limit request never
//! reaches the service), translates, and maps [`ServiceError`]s to status
//! codes; leases, receipts and Kafka are the service's business.
//!
//! [`ServiceError`]: crate::service::ServiceError

pub mod codec;
mod edge;
pub mod grpc;
pub mod http;
pub(crate) mod json;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use axum::serve::ListenerExt as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::security::tls::{tls_incoming, TlsListener};
use crate::security::ListenerTls;
use crate::service::QueueService;
use std::future::IntoFuture as _;

pub use edge::{DEFAULT_RECEIVE_MESSAGES, MAX_ACK_RECEIPTS, MAX_NACK_ERROR_BYTES};
pub use grpc::{grpc_service, grpc_service_with_access, GrpcApi};
pub use http::{
    http_router, http_router_with_access, route_action, HttpRoute, Requirement,
    HTTP_BODY_LIMIT_BYTES, HTTP_ROUTES,
};

/// At most this many gRPC calls in progress on one connection (an HTTP/2
/// setting the client honours): each may be a receive holding a long poll.
pub const GRPC_MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// Both API servers, bound and running.
#[derive(Debug)]
pub struct Servers {
    /// Where the HTTP/JSON API listens (the real port when 0 was asked for).
    pub http: SocketAddr,
    /// Where the gRPC API listens.
    pub grpc: SocketAddr,
    /// Where the routes other instances forward to listen, when served.
    pub internal: Option<SocketAddr>,
    running: JoinHandle<anyhow::Result<()>>,
}

impl Servers {
    /// Waits until both servers have stopped: after the shutdown future
    /// resolved and the requests in progress were answered (a long-poll
    /// receive may hold this up to its wait, at most 20 s), or after one of
    /// them failed.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.running.await.context("the API server task panicked")?
    }
}

/// Serves the HTTP API on `http` and the gRPC API on `grpc` until
/// `shutdown` resolves, then stops accepting and finishes the requests in
/// progress. `metrics` is rendered at `GET /metrics` (404 when `None`).
pub async fn serve<S: QueueService>(
    service: Arc<S>,
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_bound(service, http, grpc, metrics, shutdown)
        .await?
        .wait()
        .await
}

/// Like [`serve`], but returns once both listeners are bound, with their
/// addresses; [`Servers::wait`] then waits for the end. A bind error is
/// returned here, before anything is served.
pub async fn serve_bound<S: QueueService>(
    service: Arc<S>,
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Servers> {
    serve_bound_parts(
        http_router(service.clone(), metrics),
        grpc_service(service),
        http,
        grpc,
        None,
        None,
        shutdown,
    )
    .await
}

/// Like [`serve_bound`], with the HTTP router and the gRPC service already
/// built, and optionally a third HTTP router on a listener of its own (the
/// dispatcher's `/internal` routes, which other instances forward to, on
/// `internal_listen`: never on the public listener). With `tls`, the
/// listeners serve TLS only (the internal one when `tls.internal` is set).
pub async fn serve_bound_parts<S: QueueService>(
    router: axum::Router,
    grpc_api: grpc::proto::dispatcher_server::DispatcherServer<GrpcApi<S>>,
    http: SocketAddr,
    grpc: SocketAddr,
    internal: Option<(TcpListener, axum::Router)>,
    tls: Option<ListenerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Servers> {
    // The process's clients (reqwest's, built without a provider of its
    // own) and the listeners use ring.
    crate::security::tls::install_ring_provider();
    let http_listener = TcpListener::bind(http)
        .await
        .with_context(|| format!("binding the HTTP API on {http}"))?;
    let grpc_listener = TcpListener::bind(grpc)
        .await
        .with_context(|| format!("binding the gRPC API on {grpc}"))?;
    let http = http_listener.local_addr()?;
    let grpc = grpc_listener.local_addr()?;
    let stopping = shutdown_signal(shutdown);

    let internal_addr = match &internal {
        Some((listener, _)) => Some(listener.local_addr()?),
        None => None,
    };
    let http_server = serve_http(
        http_listener,
        router,
        tls.as_ref().map(|t| t.http.clone()),
        stopping.clone(),
    )?;
    let internal_server = match internal {
        Some((listener, router)) => Some(serve_http(
            listener,
            router,
            tls.as_ref().and_then(|t| t.internal.clone()),
            stopping.clone(),
        )?),
        None => None,
    };
    let grpc_builder = tonic::transport::Server::builder()
        .max_concurrent_streams(GRPC_MAX_STREAMS_PER_CONNECTION)
        .add_service(grpc_api);
    let grpc_server: BoxedServer =
        match tls.as_ref().map(|t| t.grpc.clone()) {
            None => Box::pin(grpc_builder.serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
                stopped(stopping),
            )),
            Some(config) => Box::pin(grpc_builder.serve_with_incoming_shutdown(
                tls_incoming(grpc_listener, config),
                stopped(stopping),
            )),
        };
    let running = tokio::spawn(async move {
        tokio::try_join!(
            async { http_server.await.context("the HTTP API server failed") },
            async { grpc_server.await.context("the gRPC API server failed") },
            async {
                match internal_server {
                    Some(server) => server.await.context("the internal HTTP server failed"),
                    None => Ok(()),
                }
            },
        )?;
        Ok(())
    });
    tracing::info!(%http, %grpc, internal = ?internal_addr, "serving the HTTP and gRPC APIs");
    Ok(Servers {
        http,
        grpc,
        internal: internal_addr,
        running,
    })
}

type BoxedServer =
    std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send + 'static>>;
type BoxedHttp = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send + 'static>>;

/// Serves `router` on `listener`, over TLS with `tls`, until `stopping` fires.
fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    stopping: watch::Receiver<()>,
) -> anyhow::Result<BoxedHttp> {
    Ok(match tls {
        None => {
            // No Nagle delay on small answers (a receive or an ack is one
            // small write each way).
            let listener = listener.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY on an HTTP connection: {e}");
                }
            });
            Box::pin(
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped(stopping))
                    .into_future(),
            )
        }
        Some(config) => Box::pin(
            axum::serve(TlsListener::new(listener, config)?, router)
                .with_graceful_shutdown(stopped(stopping))
                .into_future(),
        ),
    })
}

/// Turns the caller's shutdown future into a signal both servers can wait
/// on: the sender is dropped when `shutdown` resolves.
fn shutdown_signal(shutdown: impl Future<Output = ()> + Send + 'static) -> watch::Receiver<()> {
    let (tx, rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(tx);
    });
    rx
}

/// Resolves once the shutdown signal has fired.
async fn stopped(mut signal: watch::Receiver<()>) {
    while signal.changed().await.is_ok() {}
}
