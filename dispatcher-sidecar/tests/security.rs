//! Dispatcher security without a broker (docs/dispatcher/security.md): the
//! HTTP and gRPC APIs over TLS with rcgen certificates, the 401/403 matrix of
//! bearer tokens and per-queue grants on both, mTLS refusing a client with
//! no certificate, the internal listener refusing a caller without the
//! internal secret, and a push to an https endpoint whose JWT and HMAC
//! signatures the test verifies. The queue service is a double: every call
//! that gets past the checks is answered 404 (unknown queue), so 404 means
//! "authorized".

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatcher_sidecar::api::grpc::proto;
use dispatcher_sidecar::api::grpc::proto::dispatcher_client::DispatcherClient;
use dispatcher_sidecar::api::{self, Servers};
use dispatcher_sidecar::config::{Config, QueueConfig};
use dispatcher_sidecar::redrive::{RedriveAction, RedriveError, RedriveJob, RedriveRequest};
use dispatcher_sidecar::security::auth::{token_sha256_hex, Access};
use dispatcher_sidecar::security::{tls, InternalAuth, ListenerTls, INTERNAL_SECRET_HEADER};
use dispatcher_sidecar::service::{
    Delivery, ExtendResult, NackRequest, NewMessage, ParkedKeyInfo, ProduceResult, QueueService,
    QueueStats, ReceiptOutcome, ReceiveRequest, ServiceError, SkipOutcome, SkipRequest,
};
use dispatcher_sidecar::trace::MessageTrace;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::oneshot;

// ---------------------------------------------------------------------------
// The test double: every queue call is "unknown queue" (404), except that a
// receive hands out `deliveries` once and acks are recorded (the push test).

#[derive(Default)]
struct Fake {
    queues: Vec<QueueConfig>,
    deliveries: Mutex<Vec<Delivery>>,
    acked: Mutex<Vec<String>>,
}

fn unknown<T>(queue: &str) -> Result<T, ServiceError> {
    Err(ServiceError::UnknownQueue(queue.into()))
}

impl QueueService for Fake {
    fn queues(&self) -> Vec<QueueConfig> {
        self.queues.clone()
    }
    async fn produce(
        &self,
        q: &str,
        _: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        unknown(q)
    }
    async fn receive(&self, q: &str, r: ReceiveRequest) -> Result<Vec<Delivery>, ServiceError> {
        if q != "pushed" {
            return unknown(q);
        }
        let ready = std::mem::take(&mut *self.deliveries.lock().unwrap());
        if ready.is_empty() {
            tokio::time::sleep(r.wait.min(Duration::from_millis(200))).await;
        }
        Ok(ready)
    }
    async fn ack(&self, q: &str, receipts: &[String]) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        if q != "pushed" {
            return unknown(q);
        }
        self.acked.lock().unwrap().extend(receipts.iter().cloned());
        Ok(vec![ReceiptOutcome::Ok; receipts.len()])
    }
    async fn nack(&self, q: &str, _: NackRequest) -> Result<ReceiptOutcome, ServiceError> {
        if q == "pushed" {
            return Ok(ReceiptOutcome::Ok);
        }
        unknown(q)
    }
    async fn extend(&self, q: &str, _: String, _: Duration) -> Result<ExtendResult, ServiceError> {
        unknown(q)
    }
    async fn stats(&self, q: &str) -> Result<QueueStats, ServiceError> {
        unknown(q)
    }
    async fn record_paused(&self, q: &str, _: bool) -> Result<(), ServiceError> {
        unknown(q)
    }
    async fn set_paused(&self, q: &str, _: bool) -> Result<(), ServiceError> {
        unknown(q)
    }
    async fn parked(&self, q: &str) -> Result<Vec<ParkedKeyInfo>, ServiceError> {
        unknown(q)
    }
    async fn skip(&self, q: &str, _: SkipRequest) -> Result<SkipOutcome, ServiceError> {
        unknown(q)
    }
    async fn trace(&self, _: &str, _: Option<&str>) -> Result<Vec<MessageTrace>, ServiceError> {
        Ok(Vec::new())
    }
    async fn redrive_start(&self, q: &str, _: RedriveRequest) -> Result<RedriveJob, RedriveError> {
        Err(unknown::<()>(q).unwrap_err().into())
    }
    async fn redrive_status(&self, q: &str) -> Result<RedriveJob, RedriveError> {
        Err(unknown::<()>(q).unwrap_err().into())
    }
    async fn redrive_control(&self, q: &str, _: RedriveAction) -> Result<RedriveJob, RedriveError> {
        Err(unknown::<()>(q).unwrap_err().into())
    }
}

// ---------------------------------------------------------------------------
// A throwaway PKI.

struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "dispatcher test CA");
        let ca = params.self_signed(&ca_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `<name>.pem` and `<name>.key`: a leaf for `localhost` and 127.0.0.3.
    fn issue(&self, name: &str, usage: rcgen::ExtendedKeyUsagePurpose) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress("127.0.0.3".parse().unwrap()));
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    /// An HTTPS client trusting the CA, with `identity`'s certificate.
    fn client(&self, identity: Option<&str>) -> reqwest::Client {
        tls::install_ring_provider();
        let (cert, key) = match identity {
            Some(n) => (
                self.path(&format!("{n}.pem")),
                self.path(&format!("{n}.key")),
            ),
            None => (PathBuf::new(), PathBuf::new()),
        };
        let config = tls::client_config(
            &self.path("ca.pem"),
            identity.map(|_| (cert.as_path(), key.as_path())),
        )
        .unwrap();
        reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .no_proxy()
            .build()
            .unwrap()
    }

    async fn grpc(&self, addr: SocketAddr) -> DispatcherClient<tonic::transport::Channel> {
        let ca = std::fs::read(self.path("ca.pem")).unwrap();
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
            .domain_name("localhost");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        DispatcherClient::new(channel)
    }
}

// ---------------------------------------------------------------------------
// A dispatcher's APIs, configured from TOML, on 127.0.0.3 ephemeral ports.

const TOKENS: [(&str, &str); 4] = [
    ("alice", "alice-token-0123456789"),
    ("bob", "bob-token-0123456789"),
    ("ops", "ops-token-0123456789"),
    ("eve", "eve-token-0123456789"),
];

fn token(principal: &str) -> String {
    TOKENS
        .iter()
        .find(|(p, _)| *p == principal)
        .unwrap()
        .1
        .into()
}

/// `[tls]` and `[auth]`: alice produces to `jobs`, bob receives from it,
/// ops administers every queue, eve is known and granted nothing.
fn secured_config(pki: &Pki, tls_extra: &str) -> Config {
    let tokens: Vec<String> = TOKENS
        .iter()
        .map(|(p, t)| {
            format!(
                "{{ principal = \"{p}\", sha256 = \"{}\" }}",
                token_sha256_hex(t)
            )
        })
        .collect();
    let text = format!(
        "[tls]\ncert_file = \"server.pem\"\nkey_file = \"server.key\"\n{tls_extra}\n\
         [auth]\ntokens = [{}]\n\
         [[auth.queue]]\nname = \"jobs\"\nproduce = [\"alice\"]\nreceive = [\"bob\"]\n\
         [[auth.queue]]\nname = \"*\"\nadmin = [\"ops\"]\n\
         [[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n",
        tokens.join(", ")
    );
    Config::parse(&text, "secure.toml", pki.dir.path()).unwrap()
}

struct Running {
    http: SocketAddr,
    grpc: SocketAddr,
    internal: Option<SocketAddr>,
    _stop: oneshot::Sender<()>,
    _servers: Servers,
}

async fn serve(config: &Config, internal: bool) -> Running {
    let fake = Arc::new(Fake {
        queues: config.queues.clone(),
        ..Fake::default()
    });
    let access = config
        .auth
        .as_ref()
        .map(|a| Arc::new(Access::new(a).unwrap()));
    let local: SocketAddr = "127.0.0.3:0".parse().unwrap();
    let internal = if internal {
        let mut router = axum::Router::new().nest(
            dispatcher_sidecar::forward::INTERNAL_PREFIX,
            api::http_router(fake.clone(), None),
        );
        if let Some(auth) = InternalAuth::new(&config.internal) {
            router = auth.layer(router);
        }
        Some((tokio::net::TcpListener::bind(local).await.unwrap(), router))
    } else {
        None
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let servers = api::serve_bound_parts(
        api::http_router_with_access(fake.clone(), None, access.clone()),
        api::grpc_service_with_access(fake, access),
        local,
        local,
        internal,
        ListenerTls::from_config(config).unwrap(),
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    Running {
        http: servers.http,
        grpc: servers.grpc,
        internal: servers.internal,
        _stop: stop,
        _servers: servers,
    }
}

/// Each queue route of the HTTP API with a body it accepts, and who may call it.
fn queue_routes() -> Vec<(&'static str, &'static str, Value, &'static str)> {
    vec![
        ("GET", "/queues/jobs", Value::Null, "any"),
        (
            "POST",
            "/queues/jobs/messages",
            json!({"messages": [{"payload": "p"}]}),
            "alice",
        ),
        ("POST", "/queues/jobs/receive", json!({}), "bob"),
        (
            "POST",
            "/queues/jobs/ack",
            json!({"receipts": ["r"]}),
            "bob",
        ),
        ("POST", "/queues/jobs/nack", json!({"receipt": "r"}), "bob"),
        (
            "POST",
            "/queues/jobs/extend",
            json!({"receipt": "r", "lease_seconds": 1}),
            "bob",
        ),
        ("POST", "/queues/jobs/pause", Value::Null, "ops"),
        ("POST", "/queues/jobs/resume", Value::Null, "ops"),
        ("GET", "/queues/jobs/parked", Value::Null, "any"),
        (
            "POST",
            "/queues/jobs/skip",
            json!({"partition": 1, "key": "K", "message_id": "m"}),
            "ops",
        ),
        (
            "POST",
            "/queues/jobs/redrive",
            json!({"rate_per_sec": 1}),
            "ops",
        ),
        ("GET", "/queues/jobs/redrive", Value::Null, "any"),
        ("POST", "/queues/jobs/redrive/cancel", Value::Null, "ops"),
    ]
}

async fn call(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: &Value,
    bearer: Option<&str>,
) -> reqwest::Response {
    let url = format!("{base}{path}");
    let mut req = match method {
        "GET" => client.get(url),
        _ => client.post(url).json(body),
    };
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn http_over_tls_answers_401_403_or_serves_by_token_and_grant() {
    let pki = Pki::new();
    pki.issue("server", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let config = secured_config(&pki, "");
    let d = serve(&config, false).await;
    let client = pki.client(None);
    let base = format!("https://127.0.0.3:{}", d.http.port());

    // Plain HTTP on the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", d.http))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());

    let health = call(&client, &base, "GET", "/healthz", &Value::Null, None).await;
    assert_eq!(health.status(), StatusCode::OK, "healthz stays open");

    for (method, path, body, allowed) in queue_routes() {
        let r = call(&client, &base, method, path, &body, None).await;
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path} without a token"
        );
        assert_eq!(
            r.headers()["www-authenticate"],
            "Bearer realm=\"dispatcher\"",
            "{method} {path}"
        );
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], "unauthenticated");
        let r = call(
            &client,
            &base,
            method,
            path,
            &body,
            Some("not-a-token-0000"),
        )
        .await;
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "{method} {path} bad token"
        );
        for (principal, _) in TOKENS {
            let r = call(&client, &base, method, path, &body, Some(&token(principal))).await;
            let may = allowed == principal || (allowed == "any" && principal != "eve");
            let want = if may {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::FORBIDDEN
            };
            assert_eq!(r.status(), want, "{method} {path} as {principal}");
            if !may {
                let e: Value = r.json().await.unwrap();
                assert_eq!(e["error"]["code"], "permission_denied", "{method} {path}");
            }
        }
    }
    // Another queue: only ops (granted on "*") gets through.
    for (principal, want) in [("alice", 403), ("ops", 404)] {
        let r = call(
            &client,
            &base,
            "POST",
            "/queues/other/pause",
            &Value::Null,
            Some(&token(principal)),
        )
        .await;
        assert_eq!(r.status().as_u16(), want, "pause other as {principal}");
    }
    // The queue list shows only what the caller may read.
    let r = call(
        &client,
        &base,
        "GET",
        "/queues",
        &Value::Null,
        Some(&token("eve")),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["queues"], json!([]));
    let r = call(
        &client,
        &base,
        "GET",
        "/queues",
        &Value::Null,
        Some(&token("bob")),
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["queues"][0]["name"],
        "jobs"
    );
    let r = call(&client, &base, "GET", "/queues", &Value::Null, None).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A message trace of a queue needs read on it.
    let r = call(
        &client,
        &base,
        "GET",
        "/messages/m-1?queue=jobs",
        &Value::Null,
        Some(&token("eve")),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = call(
        &client,
        &base,
        "GET",
        "/messages/m-1?queue=jobs",
        &Value::Null,
        Some(&token("alice")),
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

fn with_token<T>(message: T, principal: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(p) = principal {
        let t = if p == "bad" {
            "bad-token-0000".to_string()
        } else {
            token(p)
        };
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

#[tokio::test]
async fn grpc_over_tls_answers_unauthenticated_permission_denied_or_serves() {
    let pki = Pki::new();
    pki.issue("server", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let config = secured_config(&pki, "");
    let d = serve(&config, false).await;
    let mut c = pki.grpc(d.grpc).await;
    use tonic::Code;
    // (who, produce, receive, ack, pause, stats)
    let cases = [
        (None, [Code::Unauthenticated; 5]),
        (Some("bad"), [Code::Unauthenticated; 5]),
        (Some("eve"), [Code::PermissionDenied; 5]),
        (
            Some("alice"),
            [
                Code::NotFound,
                Code::PermissionDenied,
                Code::PermissionDenied,
                Code::PermissionDenied,
                Code::NotFound,
            ],
        ),
        (
            Some("bob"),
            [
                Code::PermissionDenied,
                Code::NotFound,
                Code::NotFound,
                Code::PermissionDenied,
                Code::NotFound,
            ],
        ),
        (
            Some("ops"),
            [
                Code::PermissionDenied,
                Code::PermissionDenied,
                Code::PermissionDenied,
                Code::NotFound,
                Code::NotFound,
            ],
        ),
    ];
    let q = || "jobs".to_string();
    for (who, want) in cases {
        let got = [
            c.produce(with_token(
                proto::ProduceRequest {
                    queue: q(),
                    messages: vec![proto::NewMessage {
                        payload: b"p".to_vec(),
                        ..Default::default()
                    }],
                },
                who,
            ))
            .await
            .unwrap_err()
            .code(),
            c.receive(with_token(
                proto::ReceiveRequest {
                    queue: q(),
                    ..Default::default()
                },
                who,
            ))
            .await
            .unwrap_err()
            .code(),
            c.ack(with_token(
                proto::AckRequest {
                    queue: q(),
                    receipts: vec!["r".into()],
                },
                who,
            ))
            .await
            .unwrap_err()
            .code(),
            c.pause(with_token(proto::PauseRequest { queue: q() }, who))
                .await
                .unwrap_err()
                .code(),
            c.stats(with_token(proto::StatsRequest { queue: q() }, who))
                .await
                .unwrap_err()
                .code(),
        ];
        assert_eq!(got, want, "as {who:?}");
    }
    let listed = c
        .list_queues(with_token(proto::ListQueuesRequest {}, Some("eve")))
        .await
        .unwrap()
        .into_inner();
    assert!(listed.queues.is_empty());
    let e = c
        .list_queues(with_token(proto::ListQueuesRequest {}, None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn mtls_refuses_a_client_without_a_certificate() {
    let pki = Pki::new();
    pki.issue("server", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    pki.issue("worker", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let config = secured_config(&pki, "client_ca_file = \"ca.pem\"\n");
    let d = serve(&config, false).await;
    let url = format!("https://127.0.0.3:{}/healthz", d.http.port());
    let refused = pki.client(None).get(&url).send().await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let ok = pki.client(Some("worker")).get(&url).send().await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    // A certificate from another CA is refused too.
    let other = Pki::new();
    other.issue("worker", rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    std::fs::copy(pki.path("ca.pem"), other.path("ca.pem")).unwrap();
    let refused = other.client(Some("worker")).get(&url).send().await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");
}

#[tokio::test]
async fn the_internal_listener_refuses_a_caller_without_the_internal_secret() {
    let text = "http_listen = \"127.0.0.3:0\"\n\
                [internal]\nsecret = \"internal-secret-0123456789\"\n\
                [[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n";
    let config = Config::parse(text, "i.toml", Path::new(".")).unwrap();
    let d = serve(&config, true).await;
    let base = format!("http://{}/internal", d.internal.unwrap());
    let client = reqwest::Client::new();
    for secret in [None, Some("wrong-secret-0123456789")] {
        let mut req = client.post(format!("{base}/queues/jobs/pause"));
        if let Some(s) = secret {
            req = req.header(INTERNAL_SECRET_HEADER, s);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "secret {secret:?}");
    }
    let r = client
        .post(format!("{base}/queues/jobs/pause"))
        .header(INTERNAL_SECRET_HEADER, "internal-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "with the secret it reaches the service"
    );
    // The public API needs no internal secret (and no [auth] is set here).
    let r = client
        .get(format!("http://{}/healthz", d.http))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_push_to_an_https_endpoint_carries_a_jwt_and_an_hmac_that_verify() {
    use std::future::IntoFuture as _;
    let pki = Pki::new();
    pki.issue("server", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    // The subscription's ES256 signing key; the receiver knows its public half.
    let signing = rcgen::KeyPair::generate().unwrap();
    std::fs::write(pki.path("signer.key"), signing.serialize_pem()).unwrap();
    let public_pem = signing.public_key_pem();

    // The endpoint: axum over TLS, recording each request.
    type Seen = Arc<Mutex<Vec<(axum::http::HeaderMap, bytes::Bytes)>>>;
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let router = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: bytes::Bytes| async move {
                record.lock().unwrap().push((headers, body));
                StatusCode::OK
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.3:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_tls = tls::server_config(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        None,
        &[b"http/1.1"],
    )
    .unwrap();
    let endpoint = tokio::spawn(
        axum::serve(tls::TlsListener::new(listener, server_tls).unwrap(), router).into_future(),
    );

    let url = format!("https://127.0.0.3:{}/hook", addr.port());
    let text = format!(
        "[[queue]]\nname = \"pushed\"\ntopic = \"pushed\"\n\
         [queue.push]\nurl = \"{url}\"\nca_file = \"ca.pem\"\ntimeout = \"5s\"\n\
         [queue.push.auth.jwt]\nkey_file = \"signer.key\"\nalgorithm = \"ES256\"\nkey_id = \"k1\"\n\
         [queue.push.auth.hmac]\nsecret = \"hmac-secret-0123456789\"\n"
    );
    let config = Config::parse(&text, "push.toml", pki.dir.path()).unwrap();
    let payload = br#"{"order":42}"#;
    let fake = one_delivery(&config, "1", 7, payload);
    let before_s = jsonwebtoken::get_current_timestamp();
    push_until_acked(&fake, &config).await;
    endpoint.abort();
    assert_eq!(*fake.acked.lock().unwrap(), vec!["receipt-1".to_string()]);
    let (headers, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(&body[..], payload);

    // The JWT: ES256 by the subscription's key, audience the endpoint URL.
    let bearer = headers["authorization"].to_str().unwrap();
    let jwt = bearer.strip_prefix("Bearer ").expect("a bearer JWT");
    let key = jsonwebtoken::DecodingKey::from_ec_pem(public_pem.as_bytes()).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[&url]);
    validation.set_issuer(&["dispatcher"]);
    let data = jsonwebtoken::decode::<Value>(jwt, &key, &validation).expect("the JWT verifies");
    assert_eq!(data.header.kid.as_deref(), Some("k1"));
    assert_eq!(data.claims["sub"], "pushed");
    let iat = data.claims["iat"].as_u64().unwrap();
    assert!(iat >= before_s && iat <= before_s + 20, "iat {iat}");
    assert_eq!(data.claims["exp"].as_u64().unwrap(), iat + 300);
    // Another audience, or another key, does not verify.
    validation.set_audience(&["https://elsewhere/hook"]);
    assert!(jsonwebtoken::decode::<Value>(jwt, &key, &validation).is_err());
    let other = rcgen::KeyPair::generate().unwrap().public_key_pem();
    validation.set_audience(&[&url]);
    let other = jsonwebtoken::DecodingKey::from_ec_pem(other.as_bytes()).unwrap();
    assert!(jsonwebtoken::decode::<Value>(jwt, &other, &validation).is_err());

    // The HMAC header: t=<unix s>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>,
    // recomputed here as a receiver would.
    let sig = headers["dispatcher-signature"].to_str().unwrap();
    let (t, v1) = sig
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .expect("t=<unix>,v1=<hex>");
    let t: u64 = t.parse().unwrap();
    assert!(t >= before_s && t <= before_s + 20);
    assert_eq!(v1, hmac_hex(t, &body));
}

/// Each gRPC push call's metadata and payload.
type SeenCalls = Arc<Mutex<Vec<(tonic::metadata::MetadataMap, Vec<u8>)>>>;

/// A gRPC push endpoint that records each call.
struct SignedGrpcEndpoint {
    seen: SeenCalls,
}

#[tonic::async_trait]
impl dispatcher_sidecar::push::proto::push_endpoint_server::PushEndpoint for SignedGrpcEndpoint {
    async fn deliver(
        &self,
        request: tonic::Request<dispatcher_sidecar::push::proto::PushRequest>,
    ) -> Result<tonic::Response<dispatcher_sidecar::push::proto::PushResponse>, tonic::Status> {
        let metadata = request.metadata().clone();
        let r = request.into_inner();
        self.seen
            .lock()
            .unwrap()
            .push((metadata, r.payload.to_vec()));
        Ok(tonic::Response::new(
            dispatcher_sidecar::push::proto::PushResponse {},
        ))
    }
}

#[tokio::test]
async fn a_grpc_push_carries_the_same_jwt_and_hmac_as_call_metadata() {
    let pki = Pki::new();
    let signing = rcgen::KeyPair::generate().unwrap();
    std::fs::write(pki.path("signer.key"), signing.serialize_pem()).unwrap();
    let public_pem = signing.public_key_pem();

    let seen: SeenCalls = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.3:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = dispatcher_sidecar::push::proto::push_endpoint_server::PushEndpointServer::new(
        SignedGrpcEndpoint { seen: seen.clone() },
    );
    let endpoint = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });

    let grpc = format!("127.0.0.3:{}", addr.port());
    let text = format!(
        "[[queue]]\nname = \"pushed\"\ntopic = \"pushed\"\n\
         [queue.push]\ngrpc = \"{grpc}\"\ntimeout = \"5s\"\n\
         [queue.push.auth.jwt]\nkey_file = \"signer.key\"\nalgorithm = \"ES256\"\n\
         [queue.push.auth.hmac]\nsecret = \"hmac-secret-0123456789\"\nheader = \"X-Signature\"\n"
    );
    let config = Config::parse(&text, "push.toml", pki.dir.path()).unwrap();
    let payload = br#"{"order":43}"#;
    let fake = one_delivery(&config, "2", 8, payload);
    push_until_acked(&fake, &config).await;
    endpoint.abort();
    let (metadata, body) = seen.lock().unwrap()[0].clone();
    assert_eq!(&body[..], payload);

    // The JWT's audience defaults to the grpc address as configured.
    let bearer = metadata.get("authorization").unwrap().to_str().unwrap();
    let jwt = bearer.strip_prefix("Bearer ").expect("a bearer JWT");
    let key = jsonwebtoken::DecodingKey::from_ec_pem(public_pem.as_bytes()).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
    validation.set_audience(&[&grpc]);
    validation.set_issuer(&["dispatcher"]);
    let data = jsonwebtoken::decode::<Value>(jwt, &key, &validation).expect("the JWT verifies");
    assert_eq!(data.claims["sub"], "pushed");

    // The HMAC, under the configured (lower-cased) name, over the payload.
    let sig = metadata.get("x-signature").unwrap().to_str().unwrap();
    let (t, v1) = sig
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .expect("t=<unix>,v1=<hex>");
    assert_eq!(v1, hmac_hex(t, &body));
}

/// A queue service double holding one delivery of `payload` for the first
/// queue of `config` (message `m-<n>`, receipt `receipt-<n>`).
fn one_delivery(config: &Config, n: &str, offset: i64, payload: &'static [u8]) -> Arc<Fake> {
    Arc::new(Fake {
        queues: config.queues.clone(),
        deliveries: Mutex::new(vec![Delivery {
            message_id: format!("m-{n}"),
            receipt: format!("receipt-{n}"),
            key: None,
            payload: bytes::Bytes::from_static(payload),
            headers: vec![],
            attempt: 1,
            enqueued_at_ms: 1_700_000_000_000,
            partition: 0,
            offset,
            lease_expires_at_ms: i64::MAX / 2,
        }]),
        ..Fake::default()
    })
}

/// Runs the pusher for `config`'s queues until `fake` saw an ack (20 s at most).
async fn push_until_acked(fake: &Arc<Fake>, config: &Config) {
    let pusher = dispatcher_sidecar::push::Pusher::start(fake.clone(), &config.queues).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while fake.acked.lock().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the push was not acked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pusher.stop().await;
}

/// The `v1` a receiver computes for the tests' HMAC secret: lowercase hex of
/// HMAC-SHA256(secret, "<t>." + body), recomputed here independently of
/// the dispatcher's code.
fn hmac_hex(t: impl std::fmt::Display, body: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"hmac-secret-0123456789").unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
