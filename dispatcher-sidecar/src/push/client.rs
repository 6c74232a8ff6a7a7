//! The two kinds of push endpoint: an HTTP POST per message (reqwest) and
//! a gRPC `Deliver` per message (tonic). Each call is bounded by the push
//! timeout and turned into an [`Outcome`].

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

use super::outcome::{grpc_outcome, http_outcome, Outcome, MAX_KEPT_BODY_BYTES};
use crate::config::PushEndpoint;
use crate::service::Delivery;

/// The generated gRPC code of `proto/push.proto` (package
/// `dispatcher.push.v1`): the client the dispatcher calls, and the server
/// trait a Rust subscriber (or a test) implements.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("dispatcher.push.v1");
}

pub(super) enum Client {
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
        /// `[queue.push.auth]`: the headers that sign each request.
        signer: Option<Box<super::sign::Signer>>,
    },
    Grpc {
        client: proto::push_endpoint_client::PushEndpointClient<tonic::transport::Channel>,
        /// `[queue.push.auth]`: the metadata that signs each call.
        signer: Option<Box<super::sign::Signer>>,
    },
}

impl Client {
    #[cfg(test)]
    pub(super) fn new(
        endpoint: &PushEndpoint,
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Client> {
        Client::with_security(endpoint, concurrency, timeout, None, None)
    }

    /// An `https://` endpoint is verified against `ca_file`'s CAs when
    /// given, else the system's; `signer` signs each HTTP request or gRPC
    /// call.
    pub(super) fn with_security(
        endpoint: &PushEndpoint,
        concurrency: u32,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
        signer: Option<super::sign::Signer>,
    ) -> anyhow::Result<Client> {
        Ok(match endpoint {
            PushEndpoint::Http(url) => {
                crate::security::tls::install_ring_provider();
                let mut builder = reqwest::Client::builder()
                    // A redirected POST would become a GET without the body.
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(timeout)
                    .pool_max_idle_per_host(concurrency as usize)
                    .tcp_nodelay(true);
                if let Some(ca) = ca_file.filter(|_| url.starts_with("https:")) {
                    builder = builder
                        .tls_backend_preconfigured(crate::security::tls::client_config(ca, None)?);
                }
                Client::Http {
                    client: builder.build()?,
                    url: reqwest::Url::parse(url)?,
                    signer: signer.map(Box::new),
                }
            }
            PushEndpoint::Grpc(address) => {
                // Lazy: the endpoint may be down at start; each call
                // (re)connects as needed and a failure is that call's.
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
                    .connect_timeout(timeout)
                    .tcp_nodelay(true)
                    .connect_lazy();
                Client::Grpc {
                    client: proto::push_endpoint_client::PushEndpointClient::new(channel),
                    signer: signer.map(Box::new),
                }
            }
        })
    }

    /// Delivers one message; whatever happens becomes an outcome within
    /// `timeout`.
    pub(super) async fn deliver(&self, queue: &str, d: &Delivery, timeout: Duration) -> Outcome {
        let call = async {
            match self {
                Client::Http {
                    client,
                    url,
                    signer,
                } => deliver_http(client, url, signer.as_deref(), queue, d, timeout).await,
                Client::Grpc { client, signer } => {
                    deliver_grpc(client.clone(), signer.as_deref(), queue, d, timeout).await
                }
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or_else(|_| Outcome::timeout(timeout))
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn deliver_http(
    client: &reqwest::Client,
    url: &reqwest::Url,
    signer: Option<&super::sign::Signer>,
    queue: &str,
    d: &Delivery,
    timeout: Duration,
) -> Outcome {
    let mut headers = http_headers(queue, d);
    if let Some(signer) = signer {
        for (name, value) in signer.headers(&d.payload, now_s()) {
            headers.insert(name, value);
        }
    }
    let sent = client
        .post(url.clone())
        .headers(headers)
        .body(d.payload.clone())
        .timeout(timeout)
        .send()
        .await;
    let mut response = match sent {
        Ok(r) => r,
        Err(e) if e.is_timeout() => return Outcome::timeout(timeout),
        Err(e) => return Outcome::transport(&error_chain(&e)),
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read (a bounded part of) the answer: its text goes into the history
    // of a failed message, and a read body lets the connection be reused.
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = MAX_KEPT_BODY_BYTES - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if body.len() >= MAX_KEPT_BODY_BYTES {
                    break;
                }
            }
            Ok(None) => break,
            // The status is the answer; a broken body only shortens the
            // history's text.
            Err(_) => break,
        }
    }
    http_outcome(
        status.as_u16(),
        status.canonical_reason(),
        retry_after.as_deref(),
        &body,
        SystemTime::now(),
    )
}

/// The error and its causes, one line: reqwest's own message is only
/// "error sending request".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The request headers of an HTTP push (`docs/dispatcher.md`, "Push").
pub(super) fn http_headers(queue: &str, d: &Delivery) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        // Every value is percent-encoded or a number: always valid.
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.append(HeaderName::from_static(name), v);
        }
    };
    put("dispatcher-queue", pct(queue.as_bytes()));
    put("dispatcher-message-id", pct(d.message_id.as_bytes()));
    put("dispatcher-attempt", d.attempt.to_string());
    put("dispatcher-partition", d.partition.to_string());
    put("dispatcher-offset", d.offset.to_string());
    put(
        "dispatcher-enqueued-at",
        crate::api::json::rfc3339_ms(d.enqueued_at_ms),
    );
    if let Some(key) = &d.key {
        put("dispatcher-key", pct(key));
    }
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    for (name, value) in &d.headers {
        let name = format!("dispatcher-header-{}", pct_name(name.as_bytes()));
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&pct(value)),
        ) {
            h.append(n, v);
        }
    }
    h
}

/// Percent-encodes every byte that is not visible ASCII, and `%` itself, so
/// any bytes survive as a header value and decode back exactly.
pub(super) fn pct(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_graphic() && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes a header name's bytes that are not an HTTP token
/// character (RFC 9110 5.6.2; `%` is one, so the result is a token).
/// Letters are lowercased: HTTP header names are not case-sensitive.
fn pct_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        let token = b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
        if token {
            out.push(char::from(b.to_ascii_lowercase()));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn deliver_grpc(
    mut client: proto::push_endpoint_client::PushEndpointClient<tonic::transport::Channel>,
    signer: Option<&super::sign::Signer>,
    queue: &str,
    d: &Delivery,
    timeout: Duration,
) -> Outcome {
    let mut request = tonic::Request::new(proto::PushRequest {
        queue: queue.to_owned(),
        message_id: d.message_id.clone(),
        key: d.key.clone(),
        payload: d.payload.clone(),
        headers: d
            .headers
            .iter()
            .map(|(name, value)| proto::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        attempt: d.attempt,
        enqueued_at_ms: d.enqueued_at_ms,
        partition: d.partition,
        offset: d.offset,
    });
    request.set_timeout(timeout);
    if let Some(signer) = signer {
        // The same values as an HTTP push's headers, as call metadata; the
        // HMAC covers the payload bytes.
        for (name, value) in signer.headers(&d.payload, now_s()) {
            let key = tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes());
            let value = value
                .to_str()
                .ok()
                .and_then(|v| tonic::metadata::MetadataValue::try_from(v).ok());
            if let (Ok(key), Some(value)) = (key, value) {
                request.metadata_mut().insert(key, value);
            }
        }
    }
    match client.deliver(request).await {
        Ok(_) => Outcome::Ack,
        Err(status) => {
            let retry_after = status
                .metadata()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            grpc_outcome(status.code(), status.message(), retry_after.as_deref())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery() -> Delivery {
        Delivery {
            message_id: "m".into(),
            receipt: "r".into(),
            key: None,
            payload: bytes::Bytes::from_static(b"p"),
            headers: vec![],
            attempt: 1,
            enqueued_at_ms: 0,
            partition: 0,
            offset: 0,
            lease_expires_at_ms: 0,
        }
    }

    /// A port nothing listens on: bound, then closed.
    async fn closed_port() -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    }

    #[tokio::test]
    async fn an_endpoint_that_refuses_connections_is_retried() {
        let addr = closed_port().await;
        let timeout = Duration::from_secs(5);
        let http =
            Client::new(&PushEndpoint::Http(format!("http://{addr}/x")), 1, timeout).unwrap();
        let outcome = http.deliver("q", &delivery(), timeout).await;
        assert_eq!(outcome.label(), "error", "{outcome:?}");
        assert!(outcome.endpoint_failed());
        let grpc = Client::new(&PushEndpoint::Grpc(addr.to_string()), 1, timeout).unwrap();
        let outcome = grpc.deliver("q", &delivery(), timeout).await;
        // tonic reports a refused connection as UNAVAILABLE.
        assert_eq!(outcome.label(), "retry", "{outcome:?}");
        let Outcome::Retry { error, .. } = outcome else {
            panic!()
        };
        assert!(error.starts_with("push: gRPC Unavailable"), "{error}");
    }

    #[test]
    fn header_values_are_percent_encoded_losslessly() {
        assert_eq!(pct(b"order-42"), "order-42");
        assert_eq!(pct(b"50% off"), "50%25%20off");
        assert_eq!(pct(&[0xff, b'\n', b'a']), "%FF%0Aa");
        assert_eq!(pct_name(b"Trace Id"), "trace%20id");
        assert_eq!(pct_name(b"x:y"), "x%3Ay");
    }

    #[test]
    fn a_delivery_becomes_dispatcher_headers() {
        let d = Delivery {
            message_id: "m 1".into(),
            receipt: "r".into(),
            key: Some(bytes::Bytes::from_static(b"k\xff")),
            payload: bytes::Bytes::from_static(b"p"),
            headers: vec![
                ("Trace".into(), b"abc".to_vec()),
                ("trace".into(), b"def".to_vec()),
                ("bin".into(), vec![0]),
            ],
            attempt: 3,
            enqueued_at_ms: 951_782_400_000,
            partition: 2,
            offset: 77,
            lease_expires_at_ms: 0,
        };
        let h = http_headers("jobs", &d);
        let get = |n: &str| h.get(n).unwrap().to_str().unwrap();
        assert_eq!(get("dispatcher-queue"), "jobs");
        assert_eq!(get("dispatcher-message-id"), "m%201");
        assert_eq!(get("dispatcher-attempt"), "3");
        assert_eq!(get("dispatcher-partition"), "2");
        assert_eq!(get("dispatcher-offset"), "77");
        assert_eq!(get("dispatcher-enqueued-at"), "2000-02-29T00:00:00.000Z");
        assert_eq!(get("dispatcher-key"), "k%FF");
        assert_eq!(get("content-type"), "application/octet-stream");
        let traces: Vec<_> = h
            .get_all("dispatcher-header-trace")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(traces, ["abc", "def"]);
        assert_eq!(get("dispatcher-header-bin"), "%00");
        let without_key = http_headers("jobs", &Delivery { key: None, ..d });
        assert!(without_key.get("dispatcher-key").is_none());
    }
}
