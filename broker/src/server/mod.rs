//! The I/O edge: the listener, one task per connection, and shutdown.

mod connection;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::broker::Broker;

/// Bytes of request frames held in memory at once across all connections.
/// Each frame takes permits (KiB, rounded up) for its size before its body
/// is read, so many connections sending large frames cannot exhaust memory.
pub const IN_FLIGHT_REQUEST_KIB: usize = 512 * 1024;

/// Accepts connections until `shutdown` flips to true.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let connections = Arc::new(Semaphore::new(broker.config.max_connections));
    let memory = Arc::new(Semaphore::new(
        IN_FLIGHT_REQUEST_KIB.max(broker.config.socket_request_max_bytes.div_ceil(1024)),
    ));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors and similar: keep serving
                        // the connections we have.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "max.connections reached; closing new connection");
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let broker = broker.clone();
                let memory = memory.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    metrics::gauge!("kafka_broker_connections").increment(1.0);
                    if let Err(e) = connection::run(broker, stream, memory, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                    metrics::gauge!("kafka_broker_connections").decrement(1.0);
                    drop(permit);
                });
            }
        }
    }
}
