//! Security between brokers and between voters, on a real three-node
//! cluster (in-process, `common::cluster`): replication over an SSL
//! inter-broker listener with client certificates and over SASL_SSL with
//! SCRAM-SHA-512, the metadata quorum over an SSL controller listener
//! (mTLS) and over SASL_PLAINTEXT with PLAIN, and what a peer without a
//! certificate, with a certificate of someone not in `super.users`, or
//! without the right password meets on each listener.
//!
//! Clients of the tests use a PLAINTEXT listener of their own; INTERNAL
//! (the inter-broker listener) and CONTROLLER are the secured ones.

mod common;

use std::time::Duration;

use broker::config::ServerConfig;
use broker::metadata::transport::{call_once, Dialer, PeerRequest, PeerResponse};
use broker::security::peer::PeerSecurity;
use broker::types::{NodeId, Offset, TopicPartition};
use common::cluster::{host, TestCluster};
use common::{batch, Client};
use hmac::Hmac;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use sha2::Sha512;

const WAIT: Duration = Duration::from_secs(20);
const CALL: Duration = Duration::from_secs(3);

/// A CA and, per name, a PEM keystore (key and chain) whose certificate
/// has `CN=<name>` and the given IP address as its subject alternative name.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test ca");
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    /// Writes `<name>.pem` and returns its path.
    fn keystore(&self, name: &str, ip: &str) -> String {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![ip.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let path = self.dir.path().join(format!("{name}.pem"));
        std::fs::write(&path, format!("{}{}", key.serialize_pem(), cert.pem())).unwrap();
        path.display().to_string()
    }

    fn truststore(&self) -> String {
        self.dir.path().join("ca.pem").display().to_string()
    }
}

/// Node `id`'s inter-broker listener port (clients and controller take
/// `base_port + 2*(id-1)` and the next one).
fn internal_port(base_port: u16, id: i32) -> u16 {
    base_port + 50 + id as u16
}

/// Per-node listeners: PLAINTEXT for the test's clients, INTERNAL between
/// brokers, CONTROLLER between voters.
fn listeners(base_port: u16, id: i32) -> Vec<(String, String)> {
    let h = host(id);
    let client = base_port + 2 * (id as u16 - 1);
    vec![(
        "listeners".into(),
        format!(
            "PLAINTEXT://{h}:{client},INTERNAL://{h}:{},CONTROLLER://{h}:{}",
            internal_port(base_port, id),
            client + 1
        ),
    )]
}

async fn create_on_all(client: &mut Client, name: &str) {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(name.into()));
    t.num_partitions = -1;
    t.replication_factor = -1;
    let mut a = create_topics_request::CreatableReplicaAssignment::default();
    a.partition_index = 0;
    a.broker_ids = vec![BrokerId(1), BrokerId(2), BrokerId(3)];
    t.assignments = vec![a];
    let mut req = CreateTopicsRequest::default();
    req.topics = vec![t];
    req.timeout_ms = 10_000;
    let resp: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0, "{:?}", resp.topics[0]);
}

/// Produces with acks=all to node 1 (the leader) and waits until all three
/// logs hold the same bytes: the followers fetched them over INTERNAL.
async fn replicates(cluster: &TestCluster, topic: &str) {
    let tp = TopicPartition::new(topic, 0);
    let mut c = cluster.client(1).await;
    create_on_all(&mut c, topic).await;
    cluster
        .wait_until("every node hosts the partition", WAIT, |cl| {
            (1..=3).all(|id| cl.broker(id).replicas.get(&tp).is_some())
        })
        .await;
    assert_eq!(
        cluster.image(1).topics[topic].partitions[0].leader,
        NodeId(1)
    );
    for i in 0..5 {
        let v = format!("v{i}");
        let r = c
            .produce(topic, 0, -1, batch(&[&v], Compression::None, None))
            .await;
        assert_eq!(r.error_code, 0, "batch {i}");
    }
    let log_end = |id: i32| {
        cluster
            .broker(id)
            .replicas
            .get(&tp)
            .map(|p| p.lock().unwrap().log_end_offset())
    };
    cluster
        .wait_until("both followers have the five batches", WAIT, |_| {
            (1..=3).all(|id| log_end(id) == Some(Offset(5)))
        })
        .await;
    let isr: Vec<i32> = cluster.image(1).topics[topic].partitions[0]
        .isr
        .iter()
        .map(|n| n.0)
        .collect();
    assert_eq!(isr, vec![1, 2, 3]);
}

/// The config of a would-be peer on 127.0.0.9, with the same protocol map
/// as the cluster and `extra` (its keystore or its login).
fn outsider(map: &str, extra: &[(&str, &str)]) -> ServerConfig {
    let mut pairs: Vec<(String, String)> = vec![
        ("node.id", "9"),
        ("process.roles", "broker,controller"),
        (
            "listeners",
            "PLAINTEXT://127.0.0.9:9,INTERNAL://127.0.0.9:10,CONTROLLER://127.0.0.9:11",
        ),
        ("listener.security.protocol.map", map),
        ("inter.broker.listener.name", "INTERNAL"),
        ("controller.quorum.voters", "9@127.0.0.9:11"),
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    pairs.push(("metrics.listen.address".into(), "none".into()));
    ServerConfig::from_pairs(pairs).unwrap()
}

/// A ReadIndex call to node 1's controller listener from node 2's address
/// (a voter's: only the authentication can turn it away).
async fn read_index(cluster: &TestCluster, security: PeerSecurity) -> Result<(), String> {
    let node = &cluster.nodes[0];
    let addr = format!("{}:{}", host(1), node.controller_port);
    let dialer = Dialer {
        source_host: Some(host(2)),
        security: std::sync::Arc::new(security),
    };
    match call_once(&addr, &dialer, &PeerRequest::ReadIndex, CALL).await {
        Ok(PeerResponse::ReadIndex(_)) => Ok(()),
        Ok(_) => Err("wrong response".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// An ApiVersions call on node 1's inter-broker listener, from node 2's address.
async fn inter_broker_call(base_port: u16, security: PeerSecurity) -> Result<(), String> {
    let addr = format!("{}:{}", host(1), internal_port(base_port, 1));
    let mut conn = broker::net::PeerConn::open(
        &addr,
        Some(&host(2)),
        &std::sync::Arc::new(security),
        StrBytes::from_static_str("outsider"),
        1 << 20,
        CALL,
        CALL,
    )
    .await
    .map_err(|e| e.to_string())?;
    let resp: ApiVersionsResponse = conn
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await
        .map_err(|e| e.to_string())?;
    assert_eq!(resp.error_code, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_and_the_quorum_run_over_mutual_tls_and_refuse_other_certificates() {
    let base = 46500;
    let pki = Pki::new();
    let truststore = pki.truststore();
    let keystores: Vec<String> = (1..=3)
        .map(|id| pki.keystore(&format!("broker{id}"), &host(id)))
        .collect();
    let map = "PLAINTEXT:PLAINTEXT,INTERNAL:SSL,CONTROLLER:SSL";
    let common = [
        ("listener.security.protocol.map", map),
        ("inter.broker.listener.name", "INTERNAL"),
        ("ssl.keystore.type", "PEM"),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", truststore.as_str()),
        ("listener.name.internal.ssl.client.auth", "required"),
        ("listener.name.controller.ssl.client.auth", "required"),
        (
            "super.users",
            "User:CN=broker1;User:CN=broker2;User:CN=broker3",
        ),
    ];
    let cluster = TestCluster::start_with(3, base, &common, |id| {
        let mut pairs = listeners(base, id);
        pairs.push((
            "ssl.keystore.location".into(),
            keystores[id as usize - 1].clone(),
        ));
        pairs
    })
    .await;
    replicates(&cluster, "over-tls").await;

    // A voter's own certificate is admitted (the control for what follows).
    let as_broker2 = outsider(
        map,
        &[
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.location", &truststore),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", &keystores[1]),
            ("listener.name.controller.ssl.client.auth", "required"),
        ],
    );
    read_index(&cluster, PeerSecurity::controller(&as_broker2).unwrap())
        .await
        .unwrap();
    inter_broker_call(base, PeerSecurity::inter_broker(&as_broker2).unwrap())
        .await
        .unwrap();

    // Without a certificate: refused on both listeners.
    let no_cert = outsider(
        map,
        &[
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.location", &truststore),
            ("listener.name.controller.ssl.client.auth", "required"),
        ],
    );
    let e = read_index(&cluster, PeerSecurity::controller(&no_cert).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("127.0.0.2"), "{e}");
    inter_broker_call(base, PeerSecurity::inter_broker(&no_cert).unwrap())
        .await
        .unwrap_err();
    // Plain TCP to the controller listener: refused.
    read_index(&cluster, PeerSecurity::plaintext())
        .await
        .unwrap_err();
    // A certificate the CA signed, for someone not in super.users: TLS
    // succeeds, the quorum refuses.
    let intruder = pki.keystore("intruder", "127.0.0.9");
    let as_intruder = outsider(
        map,
        &[
            ("ssl.truststore.type", "PEM"),
            ("ssl.truststore.location", &truststore),
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", &intruder),
            ("listener.name.controller.ssl.client.auth", "required"),
        ],
    );
    read_index(&cluster, PeerSecurity::controller(&as_intruder).unwrap())
        .await
        .unwrap_err();
    // The quorum still works after all that.
    cluster
        .wait_until("an agreed leader", WAIT, |c| c.leader().is_some())
        .await;
    cluster.shutdown().await;
}

type HmacSha512 = Hmac<Sha512>;

async fn set_scram(client: &mut Client, user: &str, password: &str) {
    let salt = b"a-random-salt-0123".to_vec();
    let iterations = 4096;
    let mut salted = [0u8; 64];
    pbkdf2::pbkdf2::<HmacSha512>(password.as_bytes(), &salt, iterations, &mut salted).unwrap();
    let r: AlterUserScramCredentialsResponse = client
        .call(
            ApiKey::AlterUserScramCredentials,
            0,
            &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                ScramCredentialUpsertion::default()
                    .with_name(StrBytes::from_string(user.to_string()))
                    .with_mechanism(2)
                    .with_iterations(iterations as i32)
                    .with_salt(salt.clone().into())
                    .with_salted_password(salted.to_vec().into()),
            ]),
        )
        .await;
    assert_eq!(r.results[0].error_code, 0);
}

fn login(module: &str, user: &str, password: &str, users: &str) -> String {
    format!(
        r#"org.apache.kafka.common.security.{module} required username="{user}" password="{password}"{users};"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_over_sasl_ssl_with_scram_and_the_quorum_over_sasl_plaintext_with_plain() {
    let base = 46600;
    let pki = Pki::new();
    let truststore = pki.truststore();
    let keystores: Vec<String> = (1..=3)
        .map(|id| pki.keystore(&format!("broker{id}"), &host(id)))
        .collect();
    let map = "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT";
    let scram = login("scram.ScramLoginModule", "broker", "broker-secret", "");
    // Voters log in as `broker`; `alice` is a PLAIN user who is not a super user.
    let plain = login(
        "plain.PlainLoginModule",
        "broker",
        "broker-secret",
        r#" user_broker="broker-secret" user_alice="alice-secret""#,
    );
    let common = [
        ("listener.security.protocol.map", map),
        ("inter.broker.listener.name", "INTERNAL"),
        ("ssl.keystore.type", "PEM"),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.location", truststore.as_str()),
        (
            "listener.name.internal.sasl.enabled.mechanisms",
            "SCRAM-SHA-512",
        ),
        ("listener.name.controller.sasl.enabled.mechanisms", "PLAIN"),
        ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
        ("sasl.mechanism.controller.protocol", "PLAIN"),
        (
            "listener.name.internal.scram-sha-512.sasl.jaas.config",
            scram.as_str(),
        ),
        (
            "listener.name.controller.plain.sasl.jaas.config",
            plain.as_str(),
        ),
        ("super.users", "User:broker"),
    ];
    // The quorum forms over SASL_PLAINTEXT: the cluster starting is the proof.
    let cluster = TestCluster::start_with(3, base, &common, |id| {
        let mut pairs = listeners(base, id);
        pairs.push((
            "ssl.keystore.location".into(),
            keystores[id as usize - 1].clone(),
        ));
        pairs
    })
    .await;

    let peer = |user: &str, password: &str| {
        outsider(
            map,
            &[
                ("ssl.truststore.type", "PEM"),
                ("ssl.truststore.location", &truststore),
                (
                    "listener.name.internal.sasl.enabled.mechanisms",
                    "SCRAM-SHA-512",
                ),
                ("listener.name.controller.sasl.enabled.mechanisms", "PLAIN"),
                ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
                ("sasl.mechanism.controller.protocol", "PLAIN"),
                (
                    "listener.name.internal.scram-sha-512.sasl.jaas.config",
                    &login("scram.ScramLoginModule", user, password, ""),
                ),
                (
                    "listener.name.controller.plain.sasl.jaas.config",
                    &login("plain.PlainLoginModule", user, password, ""),
                ),
            ],
        )
    };

    // The brokers' SCRAM user does not exist yet: nobody completes the
    // handshake on the inter-broker listener.
    let broker_login = peer("broker", "broker-secret");
    let e = inter_broker_call(base, PeerSecurity::inter_broker(&broker_login).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");
    let mut admin = cluster.client(1).await;
    set_scram(&mut admin, "broker", "broker-secret").await;
    cluster
        .wait_until("every node has the credential", WAIT, |c| {
            (1..=3).all(|id| !c.image(id).scram_credentials.is_empty())
        })
        .await;
    inter_broker_call(base, PeerSecurity::inter_broker(&broker_login).unwrap())
        .await
        .unwrap();
    replicates(&cluster, "over-sasl").await;

    // A wrong password fails the SCRAM handshake on the inter-broker listener.
    let wrong = peer("broker", "guess");
    let e = inter_broker_call(base, PeerSecurity::inter_broker(&wrong).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");

    // The controller listener: the voters' login works, a wrong password, a
    // user who is not a super user, and no login at all do not.
    read_index(&cluster, PeerSecurity::controller(&broker_login).unwrap())
        .await
        .unwrap();
    let e = read_index(&cluster, PeerSecurity::controller(&wrong).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("Invalid username or password"), "{e}");
    let alice = peer("alice", "alice-secret");
    let e = read_index(&cluster, PeerSecurity::controller(&alice).unwrap())
        .await
        .unwrap_err();
    assert!(e.contains("super.users"), "{e}");
    read_index(&cluster, PeerSecurity::plaintext())
        .await
        .unwrap_err();
    cluster.shutdown().await;
}

/// KIP-368 on the broker's own client: a peer connection logs in again on
/// the same connection before the session its peer granted ends, so the
/// peer (which closes a connection whose session expired) keeps serving it.
#[tokio::test]
async fn a_peer_connection_reauthenticates_before_its_session_ends() {
    let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required \
                username=\"broker\" password=\"broker-secret\" user_broker=\"broker-secret\";";
    let map = "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT";
    let b = common::start(&[
        (
            "listeners",
            "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
        ),
        ("listener.security.protocol.map", map),
        ("inter.broker.listener.name", "INTERNAL"),
        ("sasl.enabled.mechanisms", "PLAIN"),
        ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
        ("listener.name.internal.plain.sasl.jaas.config", jaas),
        ("connections.max.reauth.ms", "700"),
    ])
    .await;
    let internal = b
        .running
        .listener_addrs
        .iter()
        .find(|(n, _)| n == "INTERNAL")
        .unwrap()
        .1;
    let login = outsider(
        map,
        &[
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
            ("listener.name.internal.plain.sasl.jaas.config", jaas),
        ],
    );
    let security = std::sync::Arc::new(PeerSecurity::inter_broker(&login).unwrap());
    let mut conn = broker::net::PeerConn::open(
        &internal.to_string(),
        None,
        &security,
        StrBytes::from_static_str("reauth"),
        1 << 20,
        CALL,
        CALL,
    )
    .await
    .unwrap();
    // Four session lifetimes, a call every 200 ms: each call after the
    // first 630 ms of a session logs in again first. (Metadata: the broker
    // answers ApiVersions even after a session ends.)
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(2_800) {
        let resp: MetadataResponse = conn
            .call(
                ApiKey::Metadata,
                12,
                &MetadataRequest::default().with_topics(Some(vec![])),
            )
            .await
            .unwrap_or_else(|e| panic!("after {:?}: {e}", started.elapsed()));
        assert_eq!(resp.brokers.len(), 1);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.running.shutdown().await;
}
