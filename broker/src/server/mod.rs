//! The I/O edge: the listeners, one task per connection, the memory budget
//! requests are charged to, and shutdown.

mod budget;
mod connection;
mod session;
mod stream;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::broker::Broker;
use crate::config::{Listener, SecurityProtocol, ServerConfig};
use crate::quota::connections::{Admission, ConnectionLimits, ConnectionQuotas};
use crate::quota::rate::RateConfig;
use crate::security::sasl::{Mechanism, MechanismConfig};
use crate::security::tls::{PrincipalMapper, ReloadingAcceptor, TlsSettings};
use crate::StartError;
use budget::MemoryBudget;

/// What a listener's connections share: its name (clients are told the
/// endpoints of the listener they came in on), its protocol, and the TLS
/// and SASL set-up that protocol needs.
pub struct ListenerContext {
    pub name: Arc<str>,
    pub protocol: SecurityProtocol,
    pub tls: Option<Arc<TlsListener>>,
    /// The enabled SASL mechanisms by Kafka name, in
    /// `sasl.enabled.mechanisms` order (the order SaslHandshake lists them).
    pub sasl: Option<Vec<SaslMechanism>>,
}

/// One enabled SASL mechanism of a listener.
pub struct SaslMechanism {
    pub name: String,
    pub mechanism: Mechanism,
    pub config: Arc<MechanismConfig>,
}

/// A TLS listener's server config (reloaded when its files change) and the
/// rules that turn a client certificate into a principal.
pub struct TlsListener {
    pub acceptor: Arc<ReloadingAcceptor>,
    pub mapper: PrincipalMapper,
}

impl TlsListener {
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.acceptor.acceptor()
    }
}

impl ListenerContext {
    /// Builds a listener's security from the config; any key that cannot
    /// be used (a missing keystore, an unknown mechanism's JAAS) stops the
    /// broker at start with the listener and key named.
    pub fn build(config: &ServerConfig, listener: &Listener) -> Result<Self, StartError> {
        let name = listener.name.clone();
        let fail = |e: String| StartError::Security(name.clone(), e);
        let protocol = config
            .security_protocol(&name)
            .ok_or_else(|| fail("no security protocol".into()))?;
        let tls = if protocol.uses_tls() {
            let get = |key: &str| config.listener_value(&name, key);
            let settings = TlsSettings::from_config(&get).map_err(|e| fail(e.to_string()))?;
            let mapper = PrincipalMapper::parse(
                &get("ssl.principal.mapping.rules").unwrap_or_else(|| "DEFAULT".into()),
            )
            .map_err(|e| fail(e.to_string()))?;
            let acceptor = ReloadingAcceptor::new(settings).map_err(|e| fail(e.to_string()))?;
            Some(Arc::new(TlsListener {
                acceptor: Arc::new(acceptor),
                mapper,
            }))
        } else {
            None
        };
        let sasl = if protocol.uses_sasl() {
            let mut mechanisms = Vec::new();
            for m in config.sasl_enabled_mechanisms(&name) {
                let mechanism: Mechanism = m
                    .parse()
                    .map_err(|_| fail(format!("SASL mechanism {m} is not supported")))?;
                let get = |key: &str| config.mechanism_value(&name, &m, key);
                let cfg = MechanismConfig::from_config(mechanism, &get)
                    .map_err(|e| fail(e.to_string()))?;
                mechanisms.push(SaslMechanism {
                    name: m,
                    mechanism,
                    config: Arc::new(cfg),
                });
            }
            Some(mechanisms)
        } else {
            None
        };
        Ok(Self {
            name: Arc::from(name.as_str()),
            protocol,
            tls,
            sasl,
        })
    }
}

/// What all listeners share: `max.connections`, the per-IP and creation
/// rate limits and the request memory budget are broker-wide, as in Kafka.
pub struct Shared {
    connections: Arc<Semaphore>,
    connection_quotas: Arc<ConnectionQuotas>,
    memory: Arc<MemoryBudget>,
}

/// The connection limits from the config: `max.connections.per.ip` and its
/// overrides (host names resolved now, as Kafka resolves them when the
/// config is read), `max.connection.creation.rate` and its per-listener
/// form.
fn connection_limits(config: &ServerConfig) -> ConnectionLimits {
    use std::net::ToSocketAddrs;
    let mut per_ip_overrides = std::collections::HashMap::new();
    for (host, count) in config.per_ip_overrides().unwrap_or_default() {
        match (host.as_str(), 0).to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    per_ip_overrides.insert(a.ip(), count);
                }
            }
            Err(e) => {
                tracing::warn!(%host, error = %e, "max.connections.per.ip.overrides: host does not resolve; ignored")
            }
        }
    }
    let unbounded = i32::MAX as i64;
    let rate = |v: i64| (v < unbounded).then_some(v as f64);
    let mut listener_rates = std::collections::HashMap::new();
    for l in &config.listeners {
        let key = format!(
            "listener.name.{}.max.connection.creation.rate",
            l.name.to_ascii_lowercase()
        );
        if let Some(v) = config
            .explicit
            .get(&key)
            .and_then(|v| v.trim().parse::<i64>().ok())
            .and_then(rate)
        {
            listener_rates.insert(l.name.clone(), v);
        }
    }
    ConnectionLimits {
        max_per_ip: config.max_connections_per_ip,
        per_ip_overrides,
        broker_rate: rate(config.max_connection_creation_rate),
        listener_rates,
    }
}

impl Shared {
    pub fn new(config: &ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            connections: Arc::new(Semaphore::new(config.max_connections)),
            connection_quotas: ConnectionQuotas::new(
                connection_limits(config),
                RateConfig::from_config(config),
            ),
            // Request bytes held at once over all connections, decoded sizes
            // included (validate() keeps it at least socket.request.max.bytes,
            // so any frame the size check lets through can be granted).
            memory: Arc::new(MemoryBudget::new(config.queued_max_request_bytes)),
        })
    }
}

/// Accepts connections until `shutdown` flips to true.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    context: ListenerContext,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let context = Arc::new(context);
    if let Some(tls) = &context.tls {
        // Certificates are re-read when their files change or on SIGHUP,
        // as Kafka re-reads keystores on a dynamic config change.
        tls.acceptor
            .clone()
            .spawn_watch(std::time::Duration::from_secs(10), shutdown.clone());
        if let Err(e) = tls.acceptor.clone().spawn_sighup(shutdown.clone()) {
            tracing::warn!(listener = %context.name, error = %e, "no SIGHUP reload of certificates");
        }
    }
    let connections = shared.connections.clone();
    let connection_quotas = shared.connection_quotas.clone();
    let memory = shared.memory.clone();
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
                    metrics::counter!("kafka_broker_connections_refused_total", "limit" => "max.connections")
                        .increment(1);
                    continue;
                };
                let now_ms = crate::broker::now_ms().max(0) as u64;
                let image = broker.metadata.image();
                let slot = match connection_quotas.admit(&context.name, peer.ip(), &image, now_ms) {
                    (Admission::Accept { delay_ms }, slot) => {
                        if delay_ms > 0 {
                            // Over the creation rate: the acceptor waits
                            // before serving this connection and accepting
                            // the next, as Kafka's acceptor blocks.
                            metrics::counter!("kafka_broker_connections_throttled_total", "limit" => "max.connection.creation.rate")
                                .increment(1);
                            tokio::select! {
                                _ = tokio::time::sleep(std::time::Duration::from_millis(delay_ms)) => {}
                                _ = shutdown.changed() => return Ok(()),
                            }
                        }
                        slot
                    }
                    (Admission::TooManyForIp { limit }, _) => {
                        tracing::info!(%peer, limit, "max.connections.per.ip reached; closing new connection");
                        metrics::counter!("kafka_broker_connections_refused_total", "limit" => "max.connections.per.ip")
                            .increment(1);
                        continue;
                    }
                    (Admission::IpThrottled { delay_ms }, _) => {
                        // Kafka holds a throttled IP's socket for the
                        // throttle time, then closes it.
                        metrics::counter!("kafka_broker_connections_refused_total", "limit" => "connection_creation_rate")
                            .increment(1);
                        tokio::spawn(async move {
                            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                            drop(stream);
                        });
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let broker = broker.clone();
                let memory = memory.clone();
                let shutdown = shutdown.clone();
                let context = context.clone();
                tokio::spawn(async move {
                    metrics::gauge!("kafka_broker_connections").increment(1.0);
                    if let Err(e) = connection::run(broker, stream, context, memory, limits, shutdown).await {
                        tracing::debug!(%peer, error = %e, "connection closed");
                    }
                    metrics::gauge!("kafka_broker_connections").decrement(1.0);
                    drop(slot);
                    drop(permit);
                });
            }
        }
    }
}
