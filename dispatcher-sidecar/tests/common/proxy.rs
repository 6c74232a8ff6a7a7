//! A Kafka-aware TCP proxy for tests that need a broker to be slow on
//! purpose: it forwards every connection to the broker, request by request,
//! and can delay or hold Produce requests by topic. The broker advertises
//! the proxy's address (`advertised.listeners`), so every client connection
//! goes through it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader};
use kafka_protocol::protocol::Decodable as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Default)]
struct Rules {
    /// Produce requests naming this topic wait this long first.
    delay: Option<(String, Duration)>,
    /// Produce requests naming this topic wait until it is released.
    hold: Option<String>,
}

/// The proxy; its tasks stop with the test's runtime.
#[derive(Clone)]
pub struct KafkaProxy {
    rules: Arc<Mutex<Rules>>,
    /// Bumped whenever a hold is released.
    released: Arc<watch::Sender<u64>>,
}

impl KafkaProxy {
    /// Listens on `listen` and forwards to `broker`.
    pub async fn start(listen: SocketAddr, broker: SocketAddr) -> KafkaProxy {
        let listener = TcpListener::bind(listen).await.unwrap();
        let proxy = KafkaProxy {
            rules: Arc::default(),
            released: Arc::new(watch::channel(0).0),
        };
        let p = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let p = p.clone();
                tokio::spawn(async move {
                    if let Ok(upstream) = TcpStream::connect(broker).await {
                        p.serve(client, upstream).await;
                    }
                });
            }
        });
        proxy
    }

    /// Produce requests to `topic` wait `delay` before they are forwarded.
    pub fn delay(&self, topic: &str, delay: Duration) {
        self.rules.lock().unwrap().delay = Some((topic.to_string(), delay));
    }

    /// Produce requests to `topic` are held (with everything behind them on
    /// their connection) until [`KafkaProxy::release`].
    pub fn hold(&self, topic: &str) {
        self.rules.lock().unwrap().hold = Some(topic.to_string());
    }

    /// Forwards what is held and holds nothing more; ends any delay.
    pub fn release(&self) {
        *self.rules.lock().unwrap() = Rules::default();
        self.released.send_modify(|n| *n += 1);
    }

    async fn serve(&self, client: TcpStream, upstream: TcpStream) {
        let (mut client_rx, mut client_tx) = client.into_split();
        let (mut up_rx, mut up_tx) = upstream.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut up_rx, &mut client_tx).await;
        });
        loop {
            let mut size = [0u8; 4];
            if client_rx.read_exact(&mut size).await.is_err() {
                return;
            }
            let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
            if client_rx.read_exact(&mut body).await.is_err() {
                return;
            }
            let topics = produce_topics(&body);
            let (delay, hold) = {
                let rules = self.rules.lock().unwrap();
                let delay = rules
                    .delay
                    .as_ref()
                    .filter(|(t, _)| topics.contains(t))
                    .map(|(_, d)| *d);
                let hold = rules.hold.as_ref().is_some_and(|t| topics.contains(t));
                (delay, hold)
            };
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
            if hold {
                let mut released = self.released.subscribe();
                while self.rules.lock().unwrap().hold.is_some() {
                    if released.changed().await.is_err() {
                        return;
                    }
                }
            }
            if up_tx.write_all(&size).await.is_err() || up_tx.write_all(&body).await.is_err() {
                return;
            }
        }
    }
}

/// The topics a Produce request names; empty for any other request.
fn produce_topics(body: &[u8]) -> Vec<String> {
    if body.len() < 4 {
        return Vec::new();
    }
    let key = i16::from_be_bytes([body[0], body[1]]);
    let version = i16::from_be_bytes([body[2], body[3]]);
    if ApiKey::try_from(key) != Ok(ApiKey::Produce) {
        return Vec::new();
    }
    let mut buf = Bytes::copy_from_slice(body);
    let Ok(_) = RequestHeader::decode(&mut buf, ApiKey::Produce.request_header_version(version))
    else {
        return Vec::new();
    };
    ProduceRequest::decode(&mut buf, version)
        .map(|r| {
            r.topic_data
                .into_iter()
                .map(|t| t.name.0.to_string())
                .collect()
        })
        .unwrap_or_default()
}
