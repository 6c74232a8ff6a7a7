use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use thiserror::Error;

use super::security::{parse_protocol_map, SecurityProtocol};
use crate::types::NodeId;

/// A config key whose value cannot be used. Printed as one line naming the
/// key; `main` exits with status 2.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid value {value:?} for config key {key}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("cannot read config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("malformed config line {line}: {text:?} (expected key=value)")]
    MalformedLine { line: usize, text: String },
    #[error("invalid argument {0:?}: usage: broker [server.properties] [--override key=value]... [--add-scram <mechanism>=[name=<user>,password=<password>]]...")]
    Usage(String),
}

/// One `NAME://host:port` entry of `listeners`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl Listener {
    pub fn socket_addr(&self) -> Result<SocketAddr, String> {
        use std::net::ToSocketAddrs;
        let host = if self.host.is_empty() {
            "0.0.0.0"
        } else {
            &self.host
        };
        (host, self.port)
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .next()
            .ok_or_else(|| format!("{host} resolves to no address"))
    }
}

/// One `id@host:port` entry of `controller.quorum.voters`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Voter {
    pub node_id: NodeId,
    pub host: String,
    pub port: u16,
}

/// The broker's configuration, with Kafka's keys. Defaults are Kafka's,
/// except where a single local node needs otherwise (listener on
/// 127.0.0.1:9092, data under `./data`).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub node_id: NodeId,
    pub listeners: Vec<Listener>,
    pub advertised_listeners: Vec<Listener>,
    pub log_dirs: Vec<PathBuf>,
    pub num_partitions: i32,
    pub default_replication_factor: i16,
    pub auto_create_topics_enable: bool,
    /// `authorizer.class.name` set to Kafka's `StandardAuthorizer`: ACLs
    /// from the metadata quorum decide every request. Off (empty) by default.
    pub authorizer_enabled: bool,
    /// `super.users`: principals (`User:admin`) every check allows.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`: a resource no ACL names is open.
    pub allow_everyone_if_no_acl_found: bool,
    pub log_retention_ms: i64,
    pub log_retention_bytes: i64,
    pub log_segment_bytes: u64,
    pub log_roll_ms: i64,
    pub log_index_interval_bytes: u32,
    pub log_cleanup_policy: String,
    pub log_cleaner_delete_retention_ms: i64,
    /// `log.cleaner.dedupe.buffer.size`: the most one cleaning pass's key
    /// map may take.
    pub log_cleaner_dedupe_buffer_size: u64,
    pub log_flush_interval_messages: u64,
    pub log_flush_interval_ms: i64,
    pub log_retention_check_interval_ms: i64,
    pub log_message_timestamp_type: String,
    /// `log.message.timestamp.before.max.ms`: how far behind the broker's
    /// clock a CreateTime record may be (Kafka's default: no bound).
    pub log_message_timestamp_before_max_ms: i64,
    /// `log.message.timestamp.after.max.ms`: how far ahead of the broker's
    /// clock a CreateTime record may be (Kafka 4's default: one hour).
    pub log_message_timestamp_after_max_ms: i64,
    pub message_max_bytes: u32,
    pub min_insync_replicas: i32,
    pub socket_request_max_bytes: usize,
    /// `fetch.max.bytes`: the most record bytes one Fetch response holds
    /// (beyond the first batch, which is always whole), whatever the
    /// request's `max_bytes`.
    pub fetch_max_bytes: i32,
    /// Requests read ahead on one connection before the reader waits for
    /// responses to drain (Kafka's `queued.max.requests` is broker-wide; this
    /// is the per-connection bound that keeps memory finite).
    pub queued_max_requests: usize,
    /// `queued.max.request.bytes`: request bytes held in memory at once over
    /// all connections, counting each request's decoded size (Kafka's
    /// default is -1, unbounded; ours is 512 MiB).
    pub queued_max_request_bytes: usize,
    /// `connections.max.idle.ms`: a connection with nothing to read and no
    /// request in progress for this long is closed.
    pub connections_max_idle_ms: u64,
    /// `socket.request.read.timeout.ms` (ours): a request must arrive whole
    /// within this long of its first byte, or the connection is closed.
    pub socket_request_read_timeout_ms: u64,
    /// `controller.max.connections.per.voter` (ours): connections the
    /// controller listener serves at once from one voter's address.
    pub controller_max_connections_per_voter: usize,
    pub max_connections: usize,
    /// `max.connections.per.ip`: connections at once from one address.
    pub max_connections_per_ip: usize,
    /// `max.connections.per.ip.overrides`: `host:count,...`.
    pub max_connections_per_ip_overrides: String,
    /// `max.connection.creation.rate`: new connections per second,
    /// broker-wide (Kafka's default, Integer.MAX_VALUE, is unbounded).
    pub max_connection_creation_rate: i64,
    /// `quota.window.num` and `quota.window.size.seconds`: client quotas
    /// are measured over this many samples of this many seconds.
    pub quota_window_num: usize,
    pub quota_window_size_seconds: u64,
    pub metrics_listen: Option<SocketAddr>,
    /// `group.*`: the classic group protocol's timing and size limits.
    pub group_initial_rebalance_delay_ms: i64,
    pub group_min_session_timeout_ms: i32,
    pub group_max_session_timeout_ms: i32,
    pub group_max_size: i32,
    /// `group.consumer.*`: KIP-848 consumer groups.
    pub group_consumer_session_timeout_ms: i32,
    pub group_consumer_heartbeat_interval_ms: i32,
    pub group_consumer_max_size: i32,
    /// The range a group's own `consumer.session.timeout.ms` and
    /// `consumer.heartbeat.interval.ms` (GROUP configs) must lie in.
    pub group_consumer_min_session_timeout_ms: i32,
    pub group_consumer_max_session_timeout_ms: i32,
    pub group_consumer_min_heartbeat_interval_ms: i32,
    pub group_consumer_max_heartbeat_interval_ms: i32,
    /// Server assignor names, the first the default.
    pub group_consumer_assignors: Vec<String>,
    /// `offsets.*`: the `__consumer_offsets` topic and committed offsets.
    pub offsets_topic_num_partitions: i32,
    /// Kafka's default is 3; ours is 1 so that a single node (the default
    /// set-up) can serve groups, as Kafka's shipped `server.properties` does.
    pub offsets_topic_replication_factor: i16,
    pub offsets_topic_segment_bytes: u64,
    /// `transaction.state.log.*`: the `__transaction_state` topic. As for
    /// `__consumer_offsets`, the replication factor and min ISR default to
    /// 1 (Kafka's are 3 and 2) so that a single node can serve transactions,
    /// as Kafka's shipped `server.properties` does.
    pub transaction_state_log_num_partitions: i32,
    pub transaction_state_log_replication_factor: i16,
    pub transaction_state_log_min_isr: i32,
    pub transaction_state_log_segment_bytes: u64,
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a
    /// producer may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transaction.version`: the finalized level of Kafka's feature of that
    /// name (Kafka sets it when the cluster is formatted, or with
    /// kafka-features.sh). 2 (KIP-890 part 2) as on a new Kafka 4.4 cluster;
    /// 0 and 1 keep Java clients on the version 1 protocol.
    pub transaction_version: i16,
    /// `transaction.partition.verification.enable`: a producer's first
    /// batch of a transaction on a partition (and a TxnOffsetCommit before
    /// v5) is appended only once the coordinator confirms the partition is
    /// in the transaction (KIP-890 part 1).
    pub transaction_partition_verification_enable: bool,
    /// `transactional.id.expiration.ms`: an idle transactional id is removed.
    pub transactional_id_expiration_ms: i64,
    /// Share groups: the `group.share.*` and `share.coordinator.*` keys. As
    /// for `__consumer_offsets`, `__share_group_state`'s replication factor
    /// and min ISR default to 1 (Kafka's are 3 and 2), as Kafka's shipped
    /// `server.properties` sets them, so that a single node can serve them.
    pub share: crate::share::config::ShareBrokerConfig,
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: u64,
    pub transaction_remove_expired_transaction_cleanup_interval_ms: u64,
    pub offsets_retention_ms: i64,
    pub offsets_retention_check_interval_ms: i64,
    pub offset_metadata_max_bytes: usize,
    /// `offsets.commit.timeout.ms`: how long an offset commit waits for the
    /// `__consumer_offsets` replicas (Kafka's default 5000).
    pub offsets_commit_timeout_ms: u64,
    /// `controller.quorum.voters`. Empty means this node alone is the metadata
    /// quorum (the embedded single-node default); otherwise every node runs in
    /// Kafka's combined mode (`process.roles=broker,controller`) and must be one
    /// of the voters.
    pub controller_quorum_voters: Vec<Voter>,
    /// Listener names that carry the metadata quorum's traffic, not clients'.
    pub controller_listener_names: Vec<String>,
    pub broker_rack: Option<String>,
    /// The active controller fences a broker it has not heard from for this long.
    pub broker_session_timeout_ms: i64,
    pub broker_heartbeat_interval_ms: i64,
    /// A follower that has not caught up to the leader's end for this long leaves the ISR.
    pub replica_lag_time_max_ms: i64,
    pub replica_fetch_max_bytes: i32,
    pub replica_fetch_response_max_bytes: i32,
    pub replica_fetch_wait_max_ms: i32,
    pub replica_fetch_min_bytes: i32,
    pub replica_fetch_backoff_ms: i64,
    /// Broker default of the topic key of the same name: may a partition whose
    /// whole ISR is gone elect an out-of-sync replica (and lose acked writes)?
    pub unclean_leader_election_enable: bool,
    /// `auto.leader.rebalance.enable`: the active controller moves each
    /// partition's leadership back to its preferred replica.
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`, in ms.
    pub leader_imbalance_check_interval_ms: i64,
    /// SIGTERM moves this node's leaderships away before it stops.
    pub controlled_shutdown_enable: bool,
    /// Kafka's `controller.quorum.election.timeout.ms`: a voter that hears
    /// nothing from the leader for between this and twice this elects.
    pub controller_quorum_election_timeout_ms: u64,
    /// Kafka's `controller.quorum.request.timeout.ms`: the bound on one call
    /// between voters (heartbeats, read index; a forwarded write also gets the
    /// leader's commit wait on top).
    pub controller_quorum_request_timeout_ms: u64,
    /// How long a starting node waits for a quorum leader and to catch up with
    /// it before giving up (ours; Kafka waits without a bound).
    pub controller_quorum_startup_timeout_ms: u64,
    /// `listener.security.protocol.map` as given; empty means Kafka's
    /// default (each protocol's name maps to itself).
    pub listener_security_protocol_map: Vec<(String, SecurityProtocol)>,
    /// `inter.broker.listener.name`, if set.
    pub inter_broker_listener_name: Option<String>,
    /// `security.inter.broker.protocol`, if set.
    pub security_inter_broker_protocol: Option<SecurityProtocol>,
    /// `connections.max.reauth.ms` (KIP-368): a SASL session lasts at most
    /// this long before the client must re-authenticate; 0 means forever.
    pub connections_max_reauth_ms: i64,
    /// `sasl.server.max.receive.size`: the largest SASL token before
    /// authentication completes (Kafka's default 512 KiB).
    pub sasl_server_max_receive_size: usize,
    /// `connection.failed.authentication.delay.ms`: a failed
    /// authentication's connection closes this long after the answer.
    pub connection_failed_authentication_delay_ms: u64,
    /// Every key that was set, as given, for DescribeConfigs (and for the
    /// per-listener `ssl.*`/`sasl.*` lookups).
    pub explicit: BTreeMap<String, String>,
    /// `--add-scram` on the command line: SCRAM users a new cluster is
    /// formed with (Kafka's `kafka-storage format --add-scram`).
    pub bootstrap_scram: Vec<BootstrapScram>,
}

/// One `--add-scram 'SCRAM-SHA-512=[name=alice,password=alice-secret]'`:
/// the stored credential, never the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapScram {
    pub user: String,
    /// The mechanism's type id (1: SCRAM-SHA-256, 2: SCRAM-SHA-512).
    pub mechanism: i8,
    pub credential: crate::metadata::StoredScramCredential,
}

impl BootstrapScram {
    /// Parses Kafka's `--add-scram` value: `<mechanism>=[name=<user>,
    /// password=<password>[,iterations=<n>]]`, a value optionally in double
    /// quotes (then it may hold commas). The salt is random, as Kafka's.
    pub fn parse(spec: &str) -> Result<Self, String> {
        use crate::security::sasl::{ScramCredential, ScramMechanism};
        let (mechanism, rest) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected <mechanism>=[name=...,password=...]"))?;
        let mech = match mechanism.trim() {
            "SCRAM-SHA-256" => ScramMechanism::Sha256,
            "SCRAM-SHA-512" => ScramMechanism::Sha512,
            other => return Err(format!("{other:?} is not SCRAM-SHA-256 or SCRAM-SHA-512")),
        };
        let body = rest
            .trim()
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .ok_or_else(|| format!("{spec:?}: the credential goes in [...]"))?;
        let (mut name, mut password, mut iterations) = (None, None, 4096);
        for (key, value) in scram_pairs(body)? {
            match key.as_str() {
                "name" => name = Some(value),
                "password" => password = Some(value),
                "iterations" => {
                    iterations = value
                        .parse::<i32>()
                        .ok()
                        .filter(|n| {
                            (ScramMechanism::MIN_ITERATIONS..=ScramMechanism::MAX_ITERATIONS)
                                .contains(n)
                        })
                        .ok_or_else(|| {
                            format!(
                                "iterations {value:?} is not between {} and {}",
                                ScramMechanism::MIN_ITERATIONS,
                                ScramMechanism::MAX_ITERATIONS
                            )
                        })?
                }
                other => {
                    return Err(format!(
                        "unknown key {other:?} (name, password, iterations)"
                    ))
                }
            }
        }
        let user = name.filter(|n| !n.is_empty()).ok_or("name is missing")?;
        let password = password.ok_or("password is missing")?;
        let mut salt = [0u8; 32];
        getrandom::fill(&mut salt).map_err(|e| format!("no random salt: {e}"))?;
        let c = ScramCredential::from_password(mech, &password, &salt, iterations);
        Ok(BootstrapScram {
            user,
            mechanism: mech.type_id(),
            credential: crate::metadata::StoredScramCredential {
                salt: c.salt,
                stored_key: c.stored_key,
                server_key: c.server_key,
                iterations: c.iterations,
            },
        })
    }
}

/// `k=v,k="v, with commas",...` into pairs.
fn scram_pairs(body: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once('=')
            .ok_or_else(|| format!("{rest:?}: expected key=value"))?;
        let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted
                .find('"')
                .ok_or_else(|| format!("{after:?}: unterminated quote"))?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            match after.find(',') {
                Some(i) => (&after[..i], &after[i..]),
                None => (after, ""),
            }
        };
        out.push((key.trim().to_string(), value.to_string()));
        rest = after.trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r.trim_start();
        } else if !rest.is_empty() {
            return Err(format!("{rest:?}: expected a comma"));
        }
    }
    Ok(out)
}

impl Default for ServerConfig {
    fn default() -> Self {
        let listener = Listener {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port: 9092,
        };
        Self {
            node_id: NodeId(1),
            listeners: vec![listener.clone()],
            advertised_listeners: vec![listener],
            log_dirs: vec![PathBuf::from("data")],
            num_partitions: 1,
            default_replication_factor: 1,
            auto_create_topics_enable: true,
            authorizer_enabled: false,
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: false,
            log_retention_ms: 7 * 24 * 3_600_000,
            log_retention_bytes: -1,
            log_segment_bytes: 1 << 30,
            log_roll_ms: 7 * 24 * 3_600_000,
            log_index_interval_bytes: 4096,
            log_cleanup_policy: "delete".into(),
            log_cleaner_delete_retention_ms: 24 * 3_600_000,
            log_cleaner_dedupe_buffer_size: crate::log::DEFAULT_CLEANER_DEDUPE_BUFFER_BYTES,
            log_flush_interval_messages: u64::MAX,
            log_flush_interval_ms: i64::MAX,
            log_retention_check_interval_ms: 300_000,
            log_message_timestamp_type: "CreateTime".into(),
            log_message_timestamp_before_max_ms: i64::MAX,
            log_message_timestamp_after_max_ms: 3_600_000,
            message_max_bytes: 1_048_588,
            min_insync_replicas: 1,
            socket_request_max_bytes: 104_857_600,
            fetch_max_bytes: 57_671_680,
            queued_max_requests: 500,
            queued_max_request_bytes: 512 << 20,
            connections_max_idle_ms: 600_000,
            socket_request_read_timeout_ms: 30_000,
            controller_max_connections_per_voter: 16,
            max_connections: 10_000,
            max_connections_per_ip: i32::MAX as usize,
            max_connections_per_ip_overrides: String::new(),
            max_connection_creation_rate: i32::MAX as i64,
            quota_window_num: 11,
            quota_window_size_seconds: 1,
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_METRICS_PORT))),
            group_initial_rebalance_delay_ms: 3_000,
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            group_max_size: i32::MAX,
            group_consumer_session_timeout_ms: 45_000,
            group_consumer_heartbeat_interval_ms: 5_000,
            group_consumer_max_size: i32::MAX,
            group_consumer_min_session_timeout_ms: 45_000,
            group_consumer_max_session_timeout_ms: 60_000,
            group_consumer_min_heartbeat_interval_ms: 5_000,
            group_consumer_max_heartbeat_interval_ms: 15_000,
            group_consumer_assignors: vec!["uniform".into(), "range".into()],
            offsets_topic_num_partitions: 50,
            offsets_topic_replication_factor: 1,
            offsets_topic_segment_bytes: 104_857_600,
            transaction_state_log_num_partitions: 50,
            transaction_state_log_replication_factor: 1,
            transaction_state_log_min_isr: 1,
            transaction_state_log_segment_bytes: 104_857_600,
            transaction_max_timeout_ms: 900_000,
            transaction_version: 2,
            transaction_partition_verification_enable: true,
            transactional_id_expiration_ms: 604_800_000,
            share: crate::share::config::ShareBrokerConfig {
                state_topic_replication_factor: 1,
                state_topic_min_isr: 1,
                ..Default::default()
            },
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            transaction_remove_expired_transaction_cleanup_interval_ms: 3_600_000,
            offsets_retention_ms: 7 * 24 * 3_600_000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            offsets_commit_timeout_ms: 5000,
            controller_quorum_voters: Vec::new(),
            controller_listener_names: vec!["CONTROLLER".into()],
            broker_rack: None,
            broker_session_timeout_ms: 9_000,
            broker_heartbeat_interval_ms: 2_000,
            replica_lag_time_max_ms: 30_000,
            replica_fetch_max_bytes: 1_048_576,
            replica_fetch_response_max_bytes: 10_485_760,
            replica_fetch_wait_max_ms: 500,
            replica_fetch_min_bytes: 1,
            replica_fetch_backoff_ms: 1_000,
            unclean_leader_election_enable: false,
            auto_leader_rebalance_enable: true,
            leader_imbalance_check_interval_ms: 300_000,
            controlled_shutdown_enable: true,
            controller_quorum_election_timeout_ms: 1_000,
            controller_quorum_request_timeout_ms: 2_000,
            controller_quorum_startup_timeout_ms: 60_000,
            listener_security_protocol_map: Vec::new(),
            inter_broker_listener_name: None,
            security_inter_broker_protocol: None,
            connections_max_reauth_ms: 0,
            sasl_server_max_receive_size: 524_288,
            connection_failed_authentication_delay_ms: 100,
            explicit: BTreeMap::new(),
            bootstrap_scram: Vec::new(),
        }
    }
}

pub(super) fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn parse_num<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError> {
    value
        .trim()
        .parse::<T>()
        .map_err(|_| invalid(key, value, "not a number in range"))
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(key, value, "expected true or false")),
    }
}

/// The Prometheus endpoint when `metrics.listen.address` is not set: port
/// 9404 on the host of the first listener, so nodes that share a machine on
/// addresses of their own (127.0.0.1, 127.0.0.2, ...) do not collide;
/// 127.0.0.1 when that listener names no single address (empty host,
/// 0.0.0.0, or a name that does not resolve).
fn default_metrics_listen(listeners: &[Listener]) -> SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
    let loopback = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_METRICS_PORT);
    let Some(host) = listeners.first().map(|l| l.host.trim_matches(['[', ']'])) else {
        return loopback;
    };
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => Some(ip),
        Err(_) if host.is_empty() => None,
        Err(_) => (host, 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .map(|a| a.ip()),
    };
    match ip {
        Some(ip) if !ip.is_unspecified() => SocketAddr::new(ip, DEFAULT_METRICS_PORT),
        _ => loopback,
    }
}

/// The port of the Prometheus endpoint unless `metrics.listen.address` says.
pub const DEFAULT_METRICS_PORT: u16 = 9404;

/// A Kafka `long` that may use Long.MAX_VALUE or -1 for "never".
fn parse_never_u64(key: &str, value: &str) -> Result<u64, ConfigError> {
    let n: i64 = parse_num(key, value)?;
    if n < 1 {
        return Err(invalid(key, value, "must be at least 1"));
    }
    Ok(if n == i64::MAX { u64::MAX } else { n as u64 })
}

fn parse_listeners(key: &str, value: &str) -> Result<Vec<Listener>, ConfigError> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, rest) = part
            .split_once("://")
            .ok_or_else(|| invalid(key, value, "expected NAME://host:port"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| invalid(key, value, "expected NAME://host:port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| invalid(key, value, format!("bad port {port:?}")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        out.push(Listener {
            name: name.to_string(),
            host: host.to_string(),
            port,
        });
    }
    if out.is_empty() {
        return Err(invalid(key, value, "no listener given"));
    }
    Ok(out)
}

fn parse_voters(key: &str, value: &str) -> Result<Vec<Voter>, ConfigError> {
    let mut out: Vec<Voter> = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('@')
            .ok_or_else(|| invalid(key, value, "expected id@host:port"))?;
        let id: i32 = id
            .trim()
            .parse()
            .map_err(|_| invalid(key, value, format!("bad node id {id:?}")))?;
        if id < 0 {
            return Err(invalid(key, value, "node ids must be non-negative"));
        }
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| invalid(key, value, "expected id@host:port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| invalid(key, value, format!("bad port {port:?}")))?;
        if out.iter().any(|v| v.node_id == NodeId(id)) {
            return Err(invalid(key, value, format!("voter {id} named twice")));
        }
        out.push(Voter {
            node_id: NodeId(id),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
        });
    }
    Ok(out)
}

impl ServerConfig {
    /// `max.connections.per.ip.overrides` as (host, count) pairs.
    pub fn per_ip_overrides(&self) -> Result<Vec<(String, usize)>, String> {
        self.max_connections_per_ip_overrides
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                let (host, count) = entry
                    .rsplit_once(':')
                    .ok_or_else(|| format!("{entry} is not host:count"))?;
                let count = count
                    .trim()
                    .parse::<usize>()
                    .map_err(|_| format!("{entry}: count is not a number"))?;
                Ok((host.trim().to_string(), count))
            })
            .collect()
    }

    /// Builds the config from command-line arguments (without the program
    /// name): an optional properties file, then `--override key=value` pairs.
    pub fn from_args(args: &[String]) -> Result<Self, ConfigError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut scram = Vec::new();
        let mut iter = args.iter();
        let mut file_seen = false;
        let add_scram = |spec: &str| {
            BootstrapScram::parse(spec).map_err(|reason| ConfigError::InvalidValue {
                key: "--add-scram".into(),
                value: spec
                    .split_once("password")
                    .map_or(spec, |(head, _)| head)
                    .into(),
                reason,
            })
        };
        while let Some(arg) = iter.next() {
            if arg == "--add-scram" {
                let spec = iter.next().ok_or_else(|| {
                    ConfigError::Usage(
                        "--add-scram needs SCRAM-SHA-512=[name=..,password=..]".into(),
                    )
                })?;
                scram.push(add_scram(spec)?);
            } else if let Some(spec) = arg.strip_prefix("--add-scram=") {
                scram.push(add_scram(spec)?);
            } else if arg == "--override" {
                let kv = iter
                    .next()
                    .ok_or_else(|| ConfigError::Usage("--override needs key=value".into()))?;
                pairs.push(split_pair(kv).ok_or_else(|| ConfigError::Usage(kv.clone()))?);
            } else if let Some(kv) = arg.strip_prefix("--override=") {
                pairs.push(split_pair(kv).ok_or_else(|| ConfigError::Usage(kv.into()))?);
            } else if !file_seen && !arg.starts_with("--") {
                file_seen = true;
                let text = std::fs::read_to_string(arg).map_err(|e| ConfigError::File {
                    path: arg.clone(),
                    reason: e.to_string(),
                })?;
                let mut from_file = parse_properties(&text)?;
                from_file.append(&mut pairs);
                pairs = from_file;
            } else {
                return Err(ConfigError::Usage(arg.clone()));
            }
        }
        let mut config = Self::from_pairs(pairs)?;
        config.bootstrap_scram = scram;
        Ok(config)
    }

    /// Applies `key=value` pairs in order over the defaults, then validates.
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(
        pairs: I,
    ) -> Result<Self, ConfigError> {
        let mut cfg = ServerConfig::default();
        let mut advertised_set = false;
        for (key, value) in pairs {
            cfg.set(&key, &value, &mut advertised_set)?;
            cfg.explicit.insert(key, value);
        }
        if !advertised_set {
            // As in Kafka's combined mode, controller listeners are not advertised to clients.
            cfg.advertised_listeners = cfg
                .listeners
                .iter()
                .filter(|l| !cfg.controller_listener_names.contains(&l.name))
                .cloned()
                .collect();
        }
        if !cfg.explicit.contains_key("metrics.listen.address") {
            cfg.metrics_listen = Some(default_metrics_listen(&cfg.listeners));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn set(
        &mut self,
        key: &str,
        value: &str,
        advertised_set: &mut bool,
    ) -> Result<(), ConfigError> {
        let v = value.trim();
        match key {
            "node.id" | "broker.id" => {
                let id: i32 = parse_num(key, v)?;
                if id < 0 {
                    return Err(invalid(key, v, "must be non-negative"));
                }
                self.node_id = NodeId(id);
            }
            "listeners" => self.listeners = parse_listeners(key, v)?,
            "advertised.listeners" => {
                self.advertised_listeners = parse_listeners(key, v)?;
                *advertised_set = true;
            }
            "log.dirs" | "log.dir" => {
                self.log_dirs = v
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect();
                if self.log_dirs.is_empty() {
                    return Err(invalid(key, v, "no directory given"));
                }
            }
            "num.partitions" => self.num_partitions = parse_num(key, v)?,
            "default.replication.factor" => self.default_replication_factor = parse_num(key, v)?,
            "auto.create.topics.enable" => self.auto_create_topics_enable = parse_bool(key, v)?,
            "authorizer.class.name" => {
                self.authorizer_enabled = match v.trim() {
                    "" => false,
                    crate::authz::STANDARD_AUTHORIZER => true,
                    _ => {
                        return Err(invalid(
                            key,
                            v,
                            "only org.apache.kafka.metadata.authorizer.StandardAuthorizer is supported (empty: no authorization)",
                        ))
                    }
                }
            }
            "super.users" => {
                self.super_users = v
                    .split(';')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(String::from)
                    .collect()
            }
            "allow.everyone.if.no.acl.found" => {
                self.allow_everyone_if_no_acl_found = parse_bool(key, v)?
            }
            "log.retention.ms" => self.log_retention_ms = parse_num(key, v)?,
            "log.retention.minutes" => {
                self.log_retention_ms = parse_num::<i64>(key, v)?.saturating_mul(60_000)
            }
            "log.retention.hours" => {
                self.log_retention_ms = parse_num::<i64>(key, v)?.saturating_mul(3_600_000)
            }
            "log.retention.bytes" => self.log_retention_bytes = parse_num(key, v)?,
            "log.segment.bytes" => self.log_segment_bytes = parse_num(key, v)?,
            "log.roll.ms" => self.log_roll_ms = parse_num(key, v)?,
            "log.roll.hours" => {
                self.log_roll_ms = parse_num::<i64>(key, v)?.saturating_mul(3_600_000)
            }
            "log.index.interval.bytes" => self.log_index_interval_bytes = parse_num(key, v)?,
            "log.cleanup.policy" => {
                super::topic::validate_cleanup_policy(v).map_err(|r| invalid(key, v, r))?;
                self.log_cleanup_policy = v.to_string();
            }
            "log.cleaner.delete.retention.ms" => {
                self.log_cleaner_delete_retention_ms = parse_num(key, v)?
            }
            "log.cleaner.dedupe.buffer.size" => {
                self.log_cleaner_dedupe_buffer_size = parse_num(key, v)?
            }
            "log.flush.interval.messages" => {
                self.log_flush_interval_messages = parse_never_u64(key, v)?
            }
            "log.flush.interval.ms" => self.log_flush_interval_ms = parse_num(key, v)?,
            "log.retention.check.interval.ms" => {
                self.log_retention_check_interval_ms = parse_num(key, v)?
            }
            "log.message.timestamp.type" => {
                if v != "CreateTime" && v != "LogAppendTime" {
                    return Err(invalid(key, v, "expected CreateTime or LogAppendTime"));
                }
                self.log_message_timestamp_type = v.to_string();
            }
            "log.message.timestamp.before.max.ms" => {
                self.log_message_timestamp_before_max_ms = parse_num(key, v)?
            }
            "log.message.timestamp.after.max.ms" => {
                self.log_message_timestamp_after_max_ms = parse_num(key, v)?
            }
            "message.max.bytes" => self.message_max_bytes = parse_num(key, v)?,
            "min.insync.replicas" => self.min_insync_replicas = parse_num(key, v)?,
            "socket.request.max.bytes" => self.socket_request_max_bytes = parse_num(key, v)?,
            "queued.max.requests" => self.queued_max_requests = parse_num(key, v)?,
            "queued.max.request.bytes" => {
                let n: i64 = parse_num(key, v)?;
                if n < 1 {
                    return Err(invalid(
                        key,
                        v,
                        "must be a positive byte count (Kafka's -1, unbounded, is not offered)",
                    ));
                }
                self.queued_max_request_bytes = n as usize;
            }
            "connections.max.idle.ms" => self.connections_max_idle_ms = parse_num(key, v)?,
            "socket.request.read.timeout.ms" => {
                self.socket_request_read_timeout_ms = parse_num(key, v)?
            }
            "controller.max.connections.per.voter" => {
                self.controller_max_connections_per_voter = parse_num(key, v)?
            }
            "max.connections" => self.max_connections = parse_num(key, v)?,
            "max.connections.per.ip" => self.max_connections_per_ip = parse_num(key, v)?,
            "max.connections.per.ip.overrides" => {
                self.max_connections_per_ip_overrides = v.to_string()
            }
            "max.connection.creation.rate" => {
                self.max_connection_creation_rate = parse_num(key, v)?
            }
            "quota.window.num" => self.quota_window_num = parse_num(key, v)?,
            "quota.window.size.seconds" => self.quota_window_size_seconds = parse_num(key, v)?,
            "metrics.listen.address" => {
                self.metrics_listen = if v.is_empty() || v == "none" {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|_| invalid(key, v, "expected host:port or none"))?,
                    )
                }
            }
            "group.initial.rebalance.delay.ms" => {
                self.group_initial_rebalance_delay_ms = parse_num(key, v)?
            }
            "group.min.session.timeout.ms" => {
                self.group_min_session_timeout_ms = parse_num(key, v)?
            }
            "group.max.session.timeout.ms" => {
                self.group_max_session_timeout_ms = parse_num(key, v)?
            }
            "group.max.size" => self.group_max_size = parse_num(key, v)?,
            "group.consumer.session.timeout.ms" => {
                self.group_consumer_session_timeout_ms = parse_num(key, v)?
            }
            "group.consumer.heartbeat.interval.ms" => {
                self.group_consumer_heartbeat_interval_ms = parse_num(key, v)?
            }
            "group.consumer.max.size" => self.group_consumer_max_size = parse_num(key, v)?,
            "group.consumer.min.session.timeout.ms" => {
                self.group_consumer_min_session_timeout_ms = parse_num(key, v)?
            }
            "group.consumer.max.session.timeout.ms" => {
                self.group_consumer_max_session_timeout_ms = parse_num(key, v)?
            }
            "group.consumer.min.heartbeat.interval.ms" => {
                self.group_consumer_min_heartbeat_interval_ms = parse_num(key, v)?
            }
            "group.consumer.max.heartbeat.interval.ms" => {
                self.group_consumer_max_heartbeat_interval_ms = parse_num(key, v)?
            }
            "group.consumer.assignors" => {
                self.group_consumer_assignors = v
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .filter(|a| !a.is_empty())
                    .collect()
            }
            "offsets.topic.num.partitions" => {
                self.offsets_topic_num_partitions = parse_num(key, v)?
            }
            "offsets.topic.replication.factor" => {
                self.offsets_topic_replication_factor = parse_num(key, v)?
            }
            "offsets.topic.segment.bytes" => self.offsets_topic_segment_bytes = parse_num(key, v)?,
            "transaction.state.log.num.partitions" => {
                self.transaction_state_log_num_partitions = parse_num(key, v)?
            }
            "transaction.state.log.replication.factor" => {
                self.transaction_state_log_replication_factor = parse_num(key, v)?
            }
            "transaction.state.log.min.isr" => {
                self.transaction_state_log_min_isr = parse_num(key, v)?
            }
            "transaction.state.log.segment.bytes" => {
                self.transaction_state_log_segment_bytes = parse_num(key, v)?
            }
            "transaction.max.timeout.ms" => self.transaction_max_timeout_ms = parse_num(key, v)?,
            "transaction.partition.verification.enable" => {
                self.transaction_partition_verification_enable = parse_bool(key, v)?
            }
            "transaction.version" => {
                let level: i16 = parse_num(key, v)?;
                if !(0..=2).contains(&level) {
                    return Err(invalid(key, v, "must be 0, 1 or 2"));
                }
                self.transaction_version = level;
            }
            "transactional.id.expiration.ms" => {
                self.transactional_id_expiration_ms = parse_num(key, v)?
            }
            "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms =
                    parse_num(key, v)?
            }
            "transaction.remove.expired.transaction.cleanup.interval.ms" => {
                self.transaction_remove_expired_transaction_cleanup_interval_ms = parse_num(key, v)?
            }
            "offsets.retention.minutes" => {
                self.offsets_retention_ms = parse_num::<i64>(key, v)?.saturating_mul(60_000)
            }
            "offsets.retention.check.interval.ms" => {
                self.offsets_retention_check_interval_ms = parse_num(key, v)?
            }
            "offset.metadata.max.bytes" => self.offset_metadata_max_bytes = parse_num(key, v)?,
            "offsets.commit.timeout.ms" => self.offsets_commit_timeout_ms = parse_num(key, v)?,
            "process.roles" => {
                let mut roles: Vec<&str> = v.split(',').map(str::trim).collect();
                roles.sort_unstable();
                if roles != ["broker", "controller"] {
                    return Err(invalid(
                        key,
                        v,
                        "only combined mode (broker,controller) is supported",
                    ));
                }
            }
            "controller.quorum.voters" => self.controller_quorum_voters = parse_voters(key, v)?,
            "controller.listener.names" => {
                self.controller_listener_names = v
                    .split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect()
            }
            "broker.rack" => {
                self.broker_rack = (!v.is_empty()).then(|| v.to_string());
            }
            "broker.session.timeout.ms" => self.broker_session_timeout_ms = parse_num(key, v)?,
            "broker.heartbeat.interval.ms" => {
                self.broker_heartbeat_interval_ms = parse_num(key, v)?
            }
            "replica.lag.time.max.ms" => self.replica_lag_time_max_ms = parse_num(key, v)?,
            "auto.leader.rebalance.enable" => {
                self.auto_leader_rebalance_enable = parse_bool(key, v)?
            }
            "leader.imbalance.check.interval.seconds" => {
                let secs: i64 = parse_num(key, v)?;
                if secs < 1 {
                    return Err(invalid(key, v, "must be at least 1"));
                }
                self.leader_imbalance_check_interval_ms = secs.saturating_mul(1000);
            }
            // Kafka's KRaft controller does not read it either: every
            // partition off its preferred leader is balanced.
            "leader.imbalance.per.broker.percentage" => {
                let _: i64 = parse_num(key, v)?;
            }
            "fetch.max.bytes" => self.fetch_max_bytes = parse_num(key, v)?,
            "replica.fetch.max.bytes" => self.replica_fetch_max_bytes = parse_num(key, v)?,
            "replica.fetch.response.max.bytes" => {
                self.replica_fetch_response_max_bytes = parse_num(key, v)?
            }
            "replica.fetch.wait.max.ms" => self.replica_fetch_wait_max_ms = parse_num(key, v)?,
            "replica.fetch.min.bytes" => self.replica_fetch_min_bytes = parse_num(key, v)?,
            "replica.fetch.backoff.ms" => self.replica_fetch_backoff_ms = parse_num(key, v)?,
            "unclean.leader.election.enable" => {
                self.unclean_leader_election_enable = parse_bool(key, v)?
            }
            "controlled.shutdown.enable" => self.controlled_shutdown_enable = parse_bool(key, v)?,
            "controller.quorum.election.timeout.ms" => {
                self.controller_quorum_election_timeout_ms = parse_num(key, v)?
            }
            "controller.quorum.request.timeout.ms" => {
                self.controller_quorum_request_timeout_ms = parse_num(key, v)?
            }
            "controller.quorum.startup.timeout.ms" => {
                self.controller_quorum_startup_timeout_ms = parse_num(key, v)?
            }
            "listener.security.protocol.map" => {
                self.listener_security_protocol_map = parse_protocol_map(key, v)?
            }
            "inter.broker.listener.name" => self.inter_broker_listener_name = Some(v.to_string()),
            "security.inter.broker.protocol" => {
                self.security_inter_broker_protocol =
                    Some(SecurityProtocol::parse(v).ok_or_else(|| {
                        invalid(
                            key,
                            v,
                            "expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
                        )
                    })?)
            }
            "connections.max.reauth.ms" => {
                self.connections_max_reauth_ms = parse_num(key, v)?;
                if self.connections_max_reauth_ms < 0 {
                    return Err(invalid(key, v, "must be at least 0"));
                }
            }
            "sasl.server.max.receive.size" => {
                self.sasl_server_max_receive_size = parse_num(key, v)?
            }
            "connection.failed.authentication.delay.ms" => {
                self.connection_failed_authentication_delay_ms = parse_num(key, v)?
            }
            k if k.starts_with("group.share.")
                || k.starts_with("share.coordinator.")
                || k.starts_with("errors.deadletterqueue.") =>
            {
                match self.share.set(k, v) {
                    Ok(true) => {}
                    Ok(false) => tracing::warn!(key = k, "ignoring unknown config key"),
                    Err(reason) => return Err(invalid(k, v, reason)),
                }
            }
            // Read per listener through `listener_value`, when the listener is built.
            k if k.starts_with("ssl.")
                || k.starts_with("sasl.")
                || k.starts_with("listener.name.") => {}
            // Defaults of topic configs, checked in `validate` and read
            // from `explicit` by `TopicConfigEntry::broker_default`.
            k if super::topic::is_topic_synonym(k) => {}
            other => {
                // Kafka logs unknown keys and carries on; so do we, so that a
                // server.properties written for Kafka starts unchanged.
                tracing::warn!(key = other, "ignoring unknown config key");
            }
        }
        Ok(())
    }

    /// Checks ranges and cross-key rules; the first problem found is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = |k: &str, v: &dyn ToString, r: &str| Err(invalid(k, &v.to_string(), r));
        if let Err(reason) = self.share.validate() {
            return Err(ConfigError::InvalidValue {
                key: "group.share.*".into(),
                value: String::new(),
                reason,
            });
        }
        super::topic::check_broker_settings(self).map_err(|e| match e {
            super::TopicConfigError::InvalidValue { key, value, reason } => {
                ConfigError::InvalidValue { key, value, reason }
            }
            other => ConfigError::InvalidValue {
                key: String::new(),
                value: String::new(),
                reason: other.to_string(),
            },
        })?;
        if self.num_partitions < 1 {
            return n("num.partitions", &self.num_partitions, "must be at least 1");
        }
        if self.default_replication_factor < 1 {
            return n(
                "default.replication.factor",
                &self.default_replication_factor,
                "must be at least 1",
            );
        }
        if self.log_segment_bytes < 14 {
            return n(
                "log.segment.bytes",
                &self.log_segment_bytes,
                "must be at least 14",
            );
        }
        if self.log_retention_ms < -1 {
            return n(
                "log.retention.ms",
                &self.log_retention_ms,
                "must be -1 or more",
            );
        }
        if self.log_roll_ms < 1 {
            return n("log.roll.ms", &self.log_roll_ms, "must be at least 1");
        }
        if self.log_message_timestamp_before_max_ms < 0 {
            return n(
                "log.message.timestamp.before.max.ms",
                &self.log_message_timestamp_before_max_ms,
                "must be at least 0",
            );
        }
        if self.log_message_timestamp_after_max_ms < 0 {
            return n(
                "log.message.timestamp.after.max.ms",
                &self.log_message_timestamp_after_max_ms,
                "must be at least 0",
            );
        }
        if self.message_max_bytes < 1 {
            return n(
                "message.max.bytes",
                &self.message_max_bytes,
                "must be at least 1",
            );
        }
        if self.min_insync_replicas < 1 {
            return n(
                "min.insync.replicas",
                &self.min_insync_replicas,
                "must be at least 1",
            );
        }
        if self.socket_request_max_bytes < 1024 {
            return n(
                "socket.request.max.bytes",
                &self.socket_request_max_bytes,
                "must be at least 1024",
            );
        }
        if self.queued_max_requests < 1 {
            return n(
                "queued.max.requests",
                &self.queued_max_requests,
                "must be at least 1",
            );
        }
        if self.queued_max_request_bytes < self.socket_request_max_bytes {
            return n(
                "queued.max.request.bytes",
                &self.queued_max_request_bytes,
                "must be at least socket.request.max.bytes",
            );
        }
        if self.max_connection_creation_rate < 0 {
            return n(
                "max.connection.creation.rate",
                &self.max_connection_creation_rate,
                "must be at least 0",
            );
        }
        if let Err(e) = self.per_ip_overrides() {
            return Err(invalid(
                "max.connections.per.ip.overrides",
                &self.max_connections_per_ip_overrides,
                e,
            ));
        }
        for (key, value) in [
            ("quota.window.num", self.quota_window_num as u64),
            ("quota.window.size.seconds", self.quota_window_size_seconds),
            ("connections.max.idle.ms", self.connections_max_idle_ms),
            (
                "socket.request.read.timeout.ms",
                self.socket_request_read_timeout_ms,
            ),
            (
                "controller.max.connections.per.voter",
                self.controller_max_connections_per_voter as u64,
            ),
            (
                "transaction.state.log.num.partitions",
                self.transaction_state_log_num_partitions.max(0) as u64,
            ),
            (
                "transaction.state.log.replication.factor",
                self.transaction_state_log_replication_factor.max(0) as u64,
            ),
            (
                "transaction.state.log.min.isr",
                self.transaction_state_log_min_isr.max(0) as u64,
            ),
            (
                "transaction.max.timeout.ms",
                self.transaction_max_timeout_ms.max(0) as u64,
            ),
            (
                "transactional.id.expiration.ms",
                self.transactional_id_expiration_ms.max(0) as u64,
            ),
            (
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            ),
            (
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                self.transaction_remove_expired_transaction_cleanup_interval_ms,
            ),
        ] {
            if value < 1 {
                return n(key, &value, "must be at least 1");
            }
        }
        if self.log_flush_interval_ms < 1 {
            return n(
                "log.flush.interval.ms",
                &self.log_flush_interval_ms,
                "must be at least 1",
            );
        }
        // Kafka's floor: 1 MiB per cleaner thread.
        if self.log_cleaner_dedupe_buffer_size < 1 << 20 {
            return n(
                "log.cleaner.dedupe.buffer.size",
                &self.log_cleaner_dedupe_buffer_size,
                "must be at least 1048576",
            );
        }
        if self.log_retention_check_interval_ms < 1 {
            return n(
                "log.retention.check.interval.ms",
                &self.log_retention_check_interval_ms,
                "must be at least 1",
            );
        }
        if self.group_initial_rebalance_delay_ms < 0 {
            return n(
                "group.initial.rebalance.delay.ms",
                &self.group_initial_rebalance_delay_ms,
                "must be at least 0",
            );
        }
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms {
            return n(
                "group.min.session.timeout.ms",
                &self.group_min_session_timeout_ms,
                "must not exceed group.max.session.timeout.ms",
            );
        }
        if self.group_max_size < 1 {
            return n("group.max.size", &self.group_max_size, "must be at least 1");
        }
        if let Err(e) = crate::coordinator::consumer_config(self) {
            return n("group.consumer.*", &"", &e);
        }
        if self.group_consumer_min_session_timeout_ms > self.group_consumer_max_session_timeout_ms {
            return n(
                "group.consumer.min.session.timeout.ms",
                &self.group_consumer_min_session_timeout_ms,
                "must not exceed group.consumer.max.session.timeout.ms",
            );
        }
        if self.group_consumer_min_heartbeat_interval_ms
            > self.group_consumer_max_heartbeat_interval_ms
        {
            return n(
                "group.consumer.min.heartbeat.interval.ms",
                &self.group_consumer_min_heartbeat_interval_ms,
                "must not exceed group.consumer.max.heartbeat.interval.ms",
            );
        }
        if self.offsets_topic_num_partitions < 1 {
            return n(
                "offsets.topic.num.partitions",
                &self.offsets_topic_num_partitions,
                "must be at least 1",
            );
        }
        if self.offsets_topic_replication_factor < 1 {
            return n(
                "offsets.topic.replication.factor",
                &self.offsets_topic_replication_factor,
                "must be at least 1",
            );
        }
        if self.offsets_retention_ms < 60_000 {
            return n(
                "offsets.retention.minutes",
                &(self.offsets_retention_ms / 60_000),
                "must be at least 1",
            );
        }
        if self.offsets_retention_check_interval_ms < 1 {
            return n(
                "offsets.retention.check.interval.ms",
                &self.offsets_retention_check_interval_ms,
                "must be at least 1",
            );
        }
        for l in &self.listeners {
            if let Err(e) = l.socket_addr() {
                return n(
                    "listeners",
                    &format!("{}://{}:{}", l.name, l.host, l.port),
                    &e,
                );
            }
        }
        self.validate_security()?;
        for a in &self.advertised_listeners {
            let known = self
                .listeners
                .iter()
                .any(|l| l.name == a.name && !self.controller_listener_names.contains(&l.name));
            if !known {
                return n(
                    "advertised.listeners",
                    &a.name,
                    "must name a listener of listeners that is not a controller listener",
                );
            }
        }
        if self.advertised_listeners.is_empty() {
            return n(
                "listeners",
                &"",
                "needs a listener for clients besides the controller listeners",
            );
        }
        for (key, value) in [
            ("broker.session.timeout.ms", self.broker_session_timeout_ms),
            (
                "broker.heartbeat.interval.ms",
                self.broker_heartbeat_interval_ms,
            ),
            ("replica.lag.time.max.ms", self.replica_lag_time_max_ms),
            ("replica.fetch.backoff.ms", self.replica_fetch_backoff_ms),
            (
                "replica.fetch.max.bytes",
                i64::from(self.replica_fetch_max_bytes),
            ),
            (
                "replica.fetch.response.max.bytes",
                i64::from(self.replica_fetch_response_max_bytes),
            ),
            (
                "replica.fetch.wait.max.ms",
                i64::from(self.replica_fetch_wait_max_ms),
            ),
            (
                "replica.fetch.min.bytes",
                i64::from(self.replica_fetch_min_bytes),
            ),
        ] {
            if value < 1 {
                return n(key, &value, "must be at least 1");
            }
        }
        if self.fetch_max_bytes < 1024 {
            return n(
                "fetch.max.bytes",
                &self.fetch_max_bytes,
                "must be at least 1024",
            );
        }
        if self.controller_quorum_election_timeout_ms < 30 {
            return n(
                "controller.quorum.election.timeout.ms",
                &self.controller_quorum_election_timeout_ms,
                "must be at least 30",
            );
        }
        for (key, value) in [
            (
                "controller.quorum.request.timeout.ms",
                self.controller_quorum_request_timeout_ms,
            ),
            (
                "controller.quorum.startup.timeout.ms",
                self.controller_quorum_startup_timeout_ms,
            ),
        ] {
            if value < 1 {
                return n(key, &value, "must be at least 1");
            }
        }
        if self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms {
            return n(
                "broker.heartbeat.interval.ms",
                &self.broker_heartbeat_interval_ms,
                "must be less than broker.session.timeout.ms",
            );
        }
        if !self.controller_quorum_voters.is_empty() {
            let Some(me) = self
                .controller_quorum_voters
                .iter()
                .find(|v| v.node_id == self.node_id)
            else {
                return n(
                    "controller.quorum.voters",
                    &self.node_id,
                    "must include this node.id (only combined broker,controller nodes are supported)",
                );
            };
            match self.controller_listener() {
                None => {
                    return n(
                        "controller.listener.names",
                        &self.controller_listener_names.join(","),
                        "no listener of listeners has this name",
                    )
                }
                Some(l) if l.port != me.port => {
                    return n(
                        "controller.quorum.voters",
                        &format!("{}@{}:{}", me.node_id, me.host, me.port),
                        &format!(
                            "this node's voter port differs from its controller listener port {}",
                            l.port
                        ),
                    )
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The listeners clients (and peer brokers) connect to: all but the
    /// controller listeners, which carry the metadata quorum.
    pub fn client_listeners(&self) -> impl Iterator<Item = &Listener> {
        self.listeners
            .iter()
            .filter(|l| !self.controller_listener_names.contains(&l.name))
    }

    /// The address a client connected on `listener` is told to use for
    /// this broker (the first advertised listener for a name not advertised).
    pub fn advertised_listener(&self, listener: &str) -> &Listener {
        self.advertised_listeners
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(listener))
            .unwrap_or(&self.advertised_listeners[0])
    }

    /// The listener the metadata quorum's peers connect to, if one is configured.
    pub fn controller_listener(&self) -> Option<&Listener> {
        self.listeners
            .iter()
            .find(|l| self.controller_listener_names.contains(&l.name))
    }

    pub fn data_dir(&self) -> &PathBuf {
        &self.log_dirs[0]
    }
}

fn split_pair(kv: &str) -> Option<(String, String)> {
    let (k, v) = kv.split_once('=')?;
    let k = k.trim();
    if k.is_empty() {
        return None;
    }
    Some((k.to_string(), v.trim().to_string()))
}

/// Parses Java-properties-style text: `key=value` or `key: value`, `#`/`!`
/// comments, blank lines. (Line continuations are rare in server.properties
/// and are not supported; such a line is reported as malformed.)
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let pair = split_pair(line).or_else(|| {
            let (k, v) = line.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        });
        match pair {
            Some(p) if !line.ends_with('\\') => out.push(p),
            _ => {
                return Err(ConfigError::MalformedLine {
                    line: i + 1,
                    text: raw.to_string(),
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_scram_parses_kafkas_format() {
        let b =
            BootstrapScram::parse(r#"SCRAM-SHA-256=[name=alice,password="a,b=c",iterations=8192]"#)
                .unwrap();
        assert_eq!((b.user.as_str(), b.mechanism), ("alice", 1));
        assert_eq!(b.credential.iterations, 8192);
        let c = crate::security::sasl::ScramCredential::from_password(
            crate::security::sasl::ScramMechanism::Sha256,
            "a,b=c",
            &b.credential.salt,
            8192,
        );
        assert_eq!(c.stored_key, b.credential.stored_key);
        let b = BootstrapScram::parse("SCRAM-SHA-512=[name=bob,password=x]").unwrap();
        assert_eq!((b.mechanism, b.credential.iterations), (2, 4096));
        for bad in [
            "SCRAM-SHA-1=[name=a,password=b]",
            "SCRAM-SHA-512=name=a,password=b",
            "SCRAM-SHA-512=[password=b]",
            "SCRAM-SHA-512=[name=a]",
            "SCRAM-SHA-512=[name=a,password=b,iterations=10]",
            "SCRAM-SHA-512=[name=a,password=b,salt=c]",
            r#"SCRAM-SHA-512=[name=a,password="b]"#,
        ] {
            assert!(BootstrapScram::parse(bad).is_err(), "{bad}");
        }
        // From the command line, and the password is kept out of errors.
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = ServerConfig::from_args(&args(&[
            "--add-scram",
            "SCRAM-SHA-512=[name=a,password=p]",
            "--add-scram=SCRAM-SHA-256=[name=b,password=q]",
        ]))
        .unwrap();
        assert_eq!(c.bootstrap_scram.len(), 2);
        let e = ServerConfig::from_args(&args(&[
            "--add-scram",
            "SCRAM-SHA-512=[name=a,password=secret,iterations=1]",
        ]))
        .unwrap_err()
        .to_string();
        assert!(!e.contains("secret"), "{e}");
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn no_arguments_is_a_local_single_node() {
        let c = ServerConfig::from_args(&[]).unwrap();
        assert_eq!(
            c.listeners[0].socket_addr().unwrap().to_string(),
            "127.0.0.1:9092"
        );
        assert_eq!(c.advertised_listeners, c.listeners);
        assert_eq!(c.data_dir(), &PathBuf::from("data"));
        assert_eq!(c.node_id, NodeId(1));
    }

    #[test]
    fn overrides_apply_after_the_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("server.properties");
        std::fs::write(
            &p,
            "# comment\nnum.partitions=3\nlisteners=PLAINTEXT://127.0.0.1:19092\nlog.retention.hours=1\n",
        )
        .unwrap();
        let c = ServerConfig::from_args(&args(&[
            p.to_str().unwrap(),
            "--override",
            "num.partitions=5",
            "--override",
            "advertised.listeners=PLAINTEXT://localhost:19092",
        ]))
        .unwrap();
        assert_eq!(c.num_partitions, 5);
        assert_eq!(c.log_retention_ms, 3_600_000);
        assert_eq!(c.listeners[0].port, 19092);
        assert_eq!(c.advertised_listeners[0].host, "localhost");
    }

    #[test]
    fn invalid_values_name_the_key() {
        for (kv, key) in [
            ("log.segment.bytes=abc", "log.segment.bytes"),
            ("num.partitions=0", "num.partitions"),
            ("auto.create.topics.enable=yes", "auto.create.topics.enable"),
            ("listeners=localhost:9092", "listeners"),
            ("log.cleanup.policy=shred", "log.cleanup.policy"),
        ] {
            let err = ServerConfig::from_args(&args(&["--override", kv])).unwrap_err();
            assert!(err.to_string().contains(key), "{err} should name {key}");
        }
    }

    #[test]
    fn the_metrics_endpoint_follows_the_first_listeners_host() {
        let with = |pairs: &[(&str, &str)]| {
            ServerConfig::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                .unwrap()
                .metrics_listen
        };
        let listeners = "listeners";
        assert_eq!(
            with(&[(
                listeners,
                "PLAINTEXT://127.0.0.2:9092,CONTROLLER://127.0.0.2:9093"
            )]),
            Some("127.0.0.2:9404".parse().unwrap())
        );
        assert_eq!(
            with(&[(listeners, "PLAINTEXT://0.0.0.0:9092")]),
            Some("127.0.0.1:9404".parse().unwrap())
        );
        assert_eq!(
            with(&[(listeners, "PLAINTEXT://:9092")]),
            Some("127.0.0.1:9404".parse().unwrap())
        );
        assert_eq!(
            with(&[
                (listeners, "PLAINTEXT://127.0.0.2:9092"),
                ("metrics.listen.address", "none")
            ]),
            None
        );
        assert_eq!(
            with(&[
                ("metrics.listen.address", "127.0.0.1:9500"),
                (listeners, "PLAINTEXT://127.0.0.3:9092")
            ]),
            Some("127.0.0.1:9500".parse().unwrap())
        );
    }

    #[test]
    fn unknown_keys_are_ignored_like_kafka() {
        let c = ServerConfig::from_args(&args(&["--override", "some.future.key=1"])).unwrap();
        assert_eq!(c.num_partitions, 1);
    }

    #[test]
    fn connection_limits_have_defaults_and_bounds() {
        let c = ServerConfig::from_args(&[]).unwrap();
        assert_eq!(c.connections_max_idle_ms, 600_000);
        assert_eq!(c.socket_request_read_timeout_ms, 30_000);
        assert_eq!(c.queued_max_request_bytes, 512 << 20);
        let c = ServerConfig::from_args(&args(&[
            "--override",
            "queued.max.request.bytes=209715200",
            "--override",
            "connections.max.idle.ms=1000",
        ]))
        .unwrap();
        assert_eq!(c.queued_max_request_bytes, 200 << 20);
        assert_eq!(c.connections_max_idle_ms, 1000);
        for bad in [
            "queued.max.request.bytes=-1",
            "queued.max.request.bytes=1048576",
            "connections.max.idle.ms=0",
            "socket.request.read.timeout.ms=0",
            "controller.max.connections.per.voter=0",
        ] {
            let err = ServerConfig::from_args(&args(&["--override", bad])).unwrap_err();
            let key = bad.split('=').next().unwrap();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }

    #[test]
    fn quorum_timeouts_have_kafkas_defaults_and_bounds() {
        let c = ServerConfig::from_args(&args(&[])).unwrap();
        assert_eq!(c.controller_quorum_election_timeout_ms, 1_000);
        assert_eq!(c.controller_quorum_request_timeout_ms, 2_000);
        assert_eq!(c.controller_quorum_startup_timeout_ms, 60_000);
        let c = ServerConfig::from_args(&args(&[
            "--override",
            "controller.quorum.election.timeout.ms=300",
        ]))
        .unwrap();
        assert_eq!(c.controller_quorum_election_timeout_ms, 300);
        for bad in [
            "controller.quorum.election.timeout.ms=29",
            "controller.quorum.request.timeout.ms=0",
            "controller.quorum.startup.timeout.ms=0",
            "controller.quorum.request.timeout.ms=-1",
        ] {
            assert!(
                matches!(
                    ServerConfig::from_args(&args(&["--override", bad])),
                    Err(ConfigError::InvalidValue { .. })
                ),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn missing_file_is_an_error() {
        assert!(matches!(
            ServerConfig::from_args(&args(&["/nonexistent/server.properties"])),
            Err(ConfigError::File { .. })
        ));
    }
}
