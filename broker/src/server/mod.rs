//! The I/O edge: the listener, one task per connection, the memory budget
//! requests are charged to, and shutdown.

mod budget;
mod connection;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::broker::Broker;
use budget::MemoryBudget;

/// Accepts connections until `shutdown` flips to true.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let connections = Arc::new(Semaphore::new(broker.config.max_connections));
    // Request bytes held at once over all connections, decoded sizes
    // included (validate() keeps it at least socket.request.max.bytes, so
    // any frame the size check lets through can be granted).
    let memory = Arc::new(MemoryBudget::new(broker.config.queued_max_request_bytes));
    let limits = connection::ReadLimits::from_config(&broker.config);
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
                    if let Err(e) = connection::run(broker, stream, memory, limits, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                    metrics::gauge!("kafka_broker_connections").decrement(1.0);
                    drop(permit);
                });
            }
        }
    }
}
