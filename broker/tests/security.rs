//! Listeners and their security protocols, over the wire: several named
//! listeners each advertising their own endpoints, TLS (with and without
//! client certificates), SASL PLAIN and SCRAM (credentials set with
//! AlterUserScramCredentials), SASL over TLS, what an unauthenticated or
//! failed client meets, and KIP-368 session expiry.

mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::{start, Client, TestBroker};
use hmac::{Hmac, Mac};
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use sha2::{Digest, Sha512};
use tokio::net::TcpStream;

const PLAIN_JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";"#;

/// A CA, a broker certificate for localhost and a client certificate for
/// alice, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    client: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "test ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();

        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "broker");
        let server = server_params.signed_by(&server_key, &ca, &ca_key).unwrap();
        // Kafka's PEM keystore: the private key and the certificate chain in
        // one file.
        std::fs::write(
            dir.path().join("broker.pem"),
            format!("{}{}", server_key.serialize_pem(), server.pem()),
        )
        .unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        client_params
            .distinguished_name
            .push(DnType::CommonName, "alice");
        client_params
            .distinguished_name
            .push(DnType::OrganizationName, "Example");
        let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();
        let client = (
            client.der().clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
        );
        Pki { dir, ca, client }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// A TLS client trusting the CA, with alice's certificate if asked.
    async fn connect(
        &self,
        addr: std::net::SocketAddr,
        with_cert: bool,
    ) -> std::io::Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        // ring, as the broker uses (deprecated only for lacking
        // post-quantum key exchange).
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_cert {
            builder
                .with_client_auth_cert(vec![self.client.0.clone()], self.client.1.clone_key())
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        // With TLS 1.3 a refused client certificate shows only on the first
        // read; a request answered proves the handshake held.
        use tokio::io::AsyncWriteExt;
        tls.flush().await?;
        Ok(Client::over(tls))
    }
}

fn addr(b: &TestBroker, listener: &str) -> std::net::SocketAddr {
    b.running
        .listener_addrs
        .iter()
        .find(|(n, _)| n == listener)
        .unwrap_or_else(|| panic!("no listener {listener}"))
        .1
}

async fn start_secure(pki: &Pki, extra: &[(&str, &str)]) -> TestBroker {
    let keystore = pki.path("broker.pem");
    let truststore = pki.path("ca.pem");
    let mut pairs: Vec<(&str, &str)> = vec![
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        ),
        (
            "advertised.listeners",
            "PLAINTEXT://127.0.0.1:0,SSL://localhost:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://localhost:0",
        ),
        ("ssl.keystore.type", "PEM"),
        ("ssl.keystore.location", &keystore),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", &truststore),
        ("listener.name.ssl.ssl.client.auth", "required"),
        ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512,OAUTHBEARER"),
        ("listener.name.sasl_plaintext.plain.sasl.jaas.config", PLAIN_JAAS),
        ("listener.name.sasl_ssl.plain.sasl.jaas.config", PLAIN_JAAS),
    ];
    pairs.extend_from_slice(extra);
    start(&pairs).await
}

async fn metadata(client: &mut Client) -> MetadataResponse {
    client
        .call(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await
}

async fn handshake(client: &mut Client, mechanism: &str) -> SaslHandshakeResponse {
    client
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default()
                .with_mechanism(StrBytes::from_string(mechanism.to_string())),
        )
        .await
}

async fn authenticate(client: &mut Client, version: i16, bytes: &[u8]) -> SaslAuthenticateResponse {
    client
        .call(
            ApiKey::SaslAuthenticate,
            version,
            &SaslAuthenticateRequest::default().with_auth_bytes(bytes.to_vec().into()),
        )
        .await
}

async fn plain_login(client: &mut Client, user: &str, password: &str) -> SaslAuthenticateResponse {
    let h = handshake(client, "PLAIN").await;
    assert_eq!(h.error_code, 0);
    authenticate(client, 2, format!("\0{user}\0{password}").as_bytes()).await
}

#[tokio::test]
async fn each_listener_advertises_its_own_endpoints() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;
    let mut plain = Client::connect(addr(&b, "PLAINTEXT")).await;
    let m = metadata(&mut plain).await;
    assert_eq!(m.brokers.len(), 1);
    assert_eq!(m.brokers[0].host.as_str(), "127.0.0.1");
    assert_eq!(m.brokers[0].port, addr(&b, "PLAINTEXT").port() as i32);

    let mut tls = pki.connect(addr(&b, "SSL"), true).await.unwrap();
    let m = metadata(&mut tls).await;
    assert_eq!(m.brokers[0].host.as_str(), "localhost");
    assert_eq!(m.brokers[0].port, addr(&b, "SSL").port() as i32);

    // FindCoordinator answers with the same listener's endpoint.
    let f: FindCoordinatorResponse = tls
        .call(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_coordinator_keys(vec![StrBytes::from_static_str("g")]),
        )
        .await;
    let c = &f.coordinators[0];
    assert_eq!(c.error_code, 0, "{:?}", c.error_message);
    assert_eq!(
        (c.host.as_str(), c.port),
        ("localhost", addr(&b, "SSL").port() as i32)
    );
}

#[tokio::test]
async fn an_ssl_listener_with_required_client_auth_refuses_a_client_without_a_certificate() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;
    let mut with_cert = pki.connect(addr(&b, "SSL"), true).await.unwrap();
    let v: ApiVersionsResponse = with_cert
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(v.error_code, 0);

    // Without a certificate: TLS 1.3 reports the refusal on the first
    // read, so the connection ends instead of answering.
    match pki.connect(addr(&b, "SSL"), false).await {
        Err(_) => {}
        Ok(mut c) => {
            c.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
                .await;
            assert!(c.closed_within(Duration::from_secs(10)).await);
        }
    }
    // A plaintext client on the TLS port gets nowhere either.
    let mut raw = Client::connect(addr(&b, "SSL")).await;
    raw.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert!(raw.closed_within(Duration::from_secs(40)).await);
    // The broker still serves.
    let mut again = pki.connect(addr(&b, "SSL"), true).await.unwrap();
    assert_eq!(metadata(&mut again).await.brokers.len(), 1);
}

#[tokio::test]
async fn sasl_plain_authenticates_and_refuses() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;

    // ApiVersions is allowed first; the handshake lists the mechanisms.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let v: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert!(v
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::SaslAuthenticate as i16));
    let h = handshake(&mut c, "PLAIN").await;
    assert_eq!(h.error_code, 0);
    let names: Vec<&str> = h.mechanisms.iter().map(|m| m.as_str()).collect();
    assert_eq!(names, ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"]);
    let a = authenticate(&mut c, 2, b"\0alice\0alice-secret").await;
    assert_eq!(a.error_code, 0, "{:?}", a.error_message);
    assert_eq!(metadata(&mut c).await.brokers.len(), 1);

    // A wrong password: SASL_AUTHENTICATION_FAILED, then the connection closes.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = plain_login(&mut c, "alice", "wrong").await;
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());
    assert!(a.error_message.is_some());
    assert!(c.closed_within(Duration::from_secs(10)).await);

    // An unknown mechanism: UNSUPPORTED_SASL_MECHANISM with the enabled list.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let h = handshake(&mut c, "GSSAPI").await;
    assert_eq!(h.error_code, ResponseError::UnsupportedSaslMechanism.code());
    assert_eq!(h.mechanisms.len(), 3);

    // Any other request before authenticating closes the connection.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    c.send(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    assert!(c.closed_within(Duration::from_secs(10)).await);

    // A token before the handshake: ILLEGAL_SASL_STATE.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = authenticate(&mut c, 2, b"\0alice\0alice-secret").await;
    assert_eq!(a.error_code, ResponseError::IllegalSaslState.code());

    // SASL on a PLAINTEXT listener: ILLEGAL_SASL_STATE.
    let mut c = Client::connect(addr(&b, "PLAINTEXT")).await;
    let h = handshake(&mut c, "PLAIN").await;
    assert_eq!(h.error_code, ResponseError::IllegalSaslState.code());

    // A SASL token larger than sasl.server.max.receive.size closes the connection.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    assert_eq!(handshake(&mut c, "PLAIN").await.error_code, 0);
    c.send(
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(vec![0u8; 600_000].into()),
    )
    .await;
    assert!(c.closed_within(Duration::from_secs(10)).await);

    // SASL over TLS.
    let mut c = pki.connect(addr(&b, "SASL_SSL"), false).await.unwrap();
    let a = plain_login(&mut c, "admin", "admin-secret").await;
    assert_eq!(a.error_code, 0, "{:?}", a.error_message);
    assert_eq!(metadata(&mut c).await.brokers[0].host.as_str(), "localhost");
}

/// An unsecured (`alg: none`) JWT, as Kafka's default OAUTHBEARER
/// validator accepts (development set-ups, librdkafka's tests).
fn unsecured_token(sub: &str, lifetime_s: i64) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let header = b64.encode(r#"{"alg":"none"}"#);
    let claims = b64.encode(format!(
        r#"{{"sub":"{sub}","iat":{now},"exp":{}}}"#,
        now + lifetime_s
    ));
    format!("{header}.{claims}.")
}

#[tokio::test]
async fn oauthbearer_with_kafkas_default_validator_and_token_lifetime() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    assert_eq!(handshake(&mut c, "OAUTHBEARER").await.error_code, 0);
    let first = format!(
        "n,,\x01auth=Bearer {}\x01\x01",
        unsecured_token("carol", 60)
    );
    let a = authenticate(&mut c, 2, first.as_bytes()).await;
    assert_eq!(a.error_code, 0, "{:?}", a.error_message);
    // Without connections.max.reauth.ms the session lasts as long as the token.
    assert!(
        (50_000..=60_000).contains(&a.session_lifetime_ms),
        "{}",
        a.session_lifetime_ms
    );
    assert_eq!(metadata(&mut c).await.brokers.len(), 1);

    // An expired token: Kafka's error challenge, then failure on the client's \x01.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    assert_eq!(handshake(&mut c, "OAUTHBEARER").await.error_code, 0);
    let first = format!(
        "n,,\x01auth=Bearer {}\x01\x01",
        unsecured_token("carol", -600)
    );
    let a = authenticate(&mut c, 2, first.as_bytes()).await;
    assert_eq!(a.error_code, 0);
    assert!(String::from_utf8_lossy(&a.auth_bytes).contains("invalid_token"));
    let a = authenticate(&mut c, 2, b"\x01").await;
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());
}

/// SaslHandshake v0 for PLAIN, then the token as a bare size-prefixed
/// frame, as older librdkafka sends it.
async fn v0_plain_login(c: &mut Client, user: &str, password: &str) {
    let h: SaslHandshakeResponse = c
        .call(
            ApiKey::SaslHandshake,
            0,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await;
    assert_eq!(h.error_code, 0);
    let token = format!("\0{user}\0{password}");
    let mut framed = (token.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(token.as_bytes());
    c.send_raw(&framed).await;
}

#[tokio::test]
async fn a_listener_that_cannot_be_set_up_stops_the_broker_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir
        .path()
        .join("no-such-keystore.pem")
        .display()
        .to_string();
    let config = common::config(
        dir.path(),
        &[
            ("listeners", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0"),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", &missing),
        ],
    );
    let e = match broker::start(config).await {
        Ok(_) => panic!("a broker without its keystore started"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("SSL") && e.contains("ssl.keystore.location"),
        "{e}"
    );
    // Nothing was registered: the data directory holds no metadata quorum.
    assert!(!dir.path().join("__cluster_metadata").exists());
}

#[tokio::test]
async fn a_v0_handshake_exchanges_bare_tokens() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;
    // The answer is a bare frame too.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    v0_plain_login(&mut c, "alice", "alice-secret").await;
    assert_eq!(c.read_frame().await.expect("an answer").len(), 0);
    assert_eq!(metadata(&mut c).await.brokers.len(), 1);

    // A wrong password: no answer, the connection closes.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    v0_plain_login(&mut c, "alice", "wrong").await;
    assert!(c.closed_within(Duration::from_secs(10)).await);
}

#[tokio::test]
async fn client_quotas_are_described_with_kafkas_filter_rules() {
    use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
    let b = start(&[]).await;
    let mut c = Client::connect(b.running.local_addr).await;
    let r: DescribeClientQuotasResponse = c
        .call(
            ApiKey::DescribeClientQuotas,
            1,
            &DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default()
                .with_entity_type(StrBytes::from_static_str("user"))
                .with_match_type(0)
                .with_match(Some(StrBytes::from_static_str("alice")))]),
        )
        .await;
    assert_eq!((r.error_code, r.entries), (0, Some(vec![])));
    let r: DescribeClientQuotasResponse = c
        .call(
            ApiKey::DescribeClientQuotas,
            1,
            &DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default()
                .with_entity_type(StrBytes::from_static_str("user"))
                .with_match_type(0)
                .with_match(None)]),
        )
        .await;
    assert_eq!(r.error_code, ResponseError::InvalidRequest.code());
}

type HmacSha512 = Hmac<Sha512>;

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = HmacSha512::new_from_slice(key).unwrap();
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = [0u8; 64];
    pbkdf2::pbkdf2::<HmacSha512>(password.as_bytes(), salt, iterations, &mut out).unwrap();
    out.to_vec()
}

/// A SCRAM-SHA-512 client (RFC 5802), written here from the RFC so the
/// broker's side is checked against an independent one. Returns the
/// broker's final answer.
async fn scram_login(client: &mut Client, user: &str, password: &str) -> SaslAuthenticateResponse {
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(handshake(client, "SCRAM-SHA-512").await.error_code, 0);
    let client_nonce = "rOprNGfwEbeRWgbNEkqO";
    let first_bare = format!("n={user},r={client_nonce}");
    let first = authenticate(client, 2, format!("n,,{first_bare}").as_bytes()).await;
    if first.error_code != 0 {
        return first;
    }
    let server_first = String::from_utf8(first.auth_bytes.to_vec()).unwrap();
    let mut nonce = "";
    let mut salt = Vec::new();
    let mut iterations = 0u32;
    for part in server_first.split(',') {
        match part.split_at(2) {
            ("r=", v) => nonce = v,
            ("s=", v) => salt = b64.decode(v).unwrap(),
            ("i=", v) => iterations = v.parse().unwrap(),
            _ => {}
        }
    }
    assert!(nonce.starts_with(client_nonce) && nonce.len() > client_nonce.len());
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{first_bare},{server_first},{without_proof}");
    let salted = salted_password(password, &salt, iterations);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Sha512::digest(&client_key);
    let signature = hmac(&stored_key, auth_message.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(a, b)| a ^ b)
        .collect();
    let last = authenticate(
        client,
        2,
        format!("{without_proof},p={}", b64.encode(proof)).as_bytes(),
    )
    .await;
    if last.error_code == 0 {
        let server_key = hmac(&salted, b"Server Key");
        let expected = hmac(&server_key, auth_message.as_bytes());
        assert_eq!(
            String::from_utf8(last.auth_bytes.to_vec()).unwrap(),
            format!("v={}", b64.encode(expected)),
            "the broker proves it knows the credential"
        );
    }
    last
}

async fn set_scram(client: &mut Client, user: &str, password: &str, iterations: i32) -> i16 {
    let salt = b"a-random-salt-0123".to_vec();
    let r: AlterUserScramCredentialsResponse = client
        .call(
            ApiKey::AlterUserScramCredentials,
            0,
            &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                ScramCredentialUpsertion::default()
                    .with_name(StrBytes::from_string(user.to_string()))
                    .with_mechanism(2)
                    .with_iterations(iterations)
                    .with_salt(salt.clone().into())
                    .with_salted_password(
                        salted_password(password, &salt, iterations.max(1) as u32).into(),
                    ),
            ]),
        )
        .await;
    assert_eq!(r.results.len(), 1);
    r.results[0].error_code
}

#[tokio::test]
async fn scram_users_live_in_the_metadata_quorum() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[]).await;
    let mut admin = Client::connect(addr(&b, "PLAINTEXT")).await;

    // Before the user exists: the exchange fails at the proof, as for a
    // wrong password (no user enumeration).
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = scram_login(&mut c, "bob", "bob-secret").await;
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());

    assert_eq!(set_scram(&mut admin, "bob", "bob-secret", 4096).await, 0);
    assert_eq!(
        set_scram(&mut admin, "carol", "c", 1000).await,
        ResponseError::UnacceptableCredential.code(),
        "Kafka's minimum of 4096 iterations"
    );
    let d: DescribeUserScramCredentialsResponse = admin
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default().with_users(Some(vec![
                UserName::default().with_name(StrBytes::from_static_str("bob")),
                UserName::default().with_name(StrBytes::from_static_str("carol")),
            ])),
        )
        .await;
    let bob = d.results.iter().find(|r| r.user.as_str() == "bob").unwrap();
    assert_eq!(bob.error_code, 0);
    assert_eq!(
        (
            bob.credential_infos[0].mechanism,
            bob.credential_infos[0].iterations
        ),
        (2, 4096)
    );
    let carol = d
        .results
        .iter()
        .find(|r| r.user.as_str() == "carol")
        .unwrap();
    assert_eq!(carol.error_code, ResponseError::ResourceNotFound.code());

    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = scram_login(&mut c, "bob", "bob-secret").await;
    assert_eq!(a.error_code, 0, "{:?}", a.error_message);
    assert_eq!(metadata(&mut c).await.brokers.len(), 1);

    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = scram_login(&mut c, "bob", "not-bobs").await;
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());
    assert!(c.closed_within(Duration::from_secs(10)).await);

    // Over TLS too.
    let mut c = pki.connect(addr(&b, "SASL_SSL"), false).await.unwrap();
    assert_eq!(scram_login(&mut c, "bob", "bob-secret").await.error_code, 0);
}

#[tokio::test]
async fn a_sasl_session_expires_after_connections_max_reauth_ms_unless_renewed() {
    let pki = Pki::new();
    let b = start_secure(&pki, &[("connections.max.reauth.ms", "1500")]).await;

    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    let a = plain_login(&mut c, "alice", "alice-secret").await;
    assert_eq!(a.error_code, 0);
    assert_eq!(a.session_lifetime_ms, 1500);
    // Re-authenticating on the same connection renews the session.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let a = plain_login(&mut c, "alice", "alice-secret").await;
    assert_eq!(a.error_code, 0);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(metadata(&mut c).await.brokers.len(), 1);
    // Re-authenticating as someone else fails.
    let a = plain_login(&mut c, "admin", "admin-secret").await;
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());

    // Left to expire, the next request closes the connection.
    let mut c = Client::connect(addr(&b, "SASL_PLAINTEXT")).await;
    assert_eq!(
        plain_login(&mut c, "alice", "alice-secret")
            .await
            .error_code,
        0
    );
    tokio::time::sleep(Duration::from_millis(1700)).await;
    c.send(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    assert!(c.closed_within(Duration::from_secs(10)).await);
}

/// `--add-scram`: users a cluster is formed with, as `kafka-storage format
/// --add-scram`; a later start's `--add-scram` changes nothing.
#[tokio::test]
async fn add_scram_forms_the_cluster_with_its_users_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let config = |spec: &str| {
        let mut c = common::config(
            dir.path(),
            &[
                (
                    "listeners",
                    "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                ),
                ("sasl.enabled.mechanisms", "SCRAM-SHA-512"),
            ],
        );
        c.bootstrap_scram = vec![broker::config::BootstrapScram::parse(spec).unwrap()];
        c
    };
    let login = |running: &broker::RunningBroker, password: &'static str| {
        let a = running
            .listener_addrs
            .iter()
            .find(|(n, _)| n == "SASL_PLAINTEXT")
            .unwrap()
            .1;
        async move {
            let mut c = Client::connect(a).await;
            scram_login(&mut c, "dora", password).await.error_code
        }
    };
    // A quoted password may hold commas.
    let running = broker::start(config(
        r#"SCRAM-SHA-512=[name=dora,password="dora,secret",iterations=8192]"#,
    ))
    .await
    .unwrap();
    assert_eq!(login(&running, "dora,secret").await, 0);
    let mut admin = Client::connect(running.local_addr).await;
    let d: DescribeUserScramCredentialsResponse = admin
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &DescribeUserScramCredentialsRequest::default().with_users(None),
        )
        .await;
    let infos: Vec<(String, i8, i32)> = d
        .results
        .iter()
        .flat_map(|r| {
            r.credential_infos
                .iter()
                .map(|i| (r.user.to_string(), i.mechanism, i.iterations))
        })
        .collect();
    assert_eq!(infos, vec![("dora".to_string(), 2, 8192)]);
    running.shutdown().await;

    // The cluster exists: a new --add-scram is ignored.
    let running = broker::start(config("SCRAM-SHA-512=[name=dora,password=other]"))
        .await
        .unwrap();
    assert_eq!(login(&running, "dora,secret").await, 0);
    assert_eq!(
        login(&running, "other").await,
        ResponseError::SaslAuthenticationFailed.code()
    );
    running.shutdown().await;
}
