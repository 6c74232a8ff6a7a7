//! The dispatcher's configuration file (TOML).
//!
//! The file is read into a `toml::Table` and walked by hand rather than
//! deserialized with derived serde impls: derived errors do not name the queue
//! or the key, and span over several lines. Here every error is ONE line that
//! names the file, the queue and the key, e.g.
//! `dispatcher.toml: queue "jobs": key "lease": invalid duration "6x"`.
//!
//! Every key except a queue's `name` and `topic`, and a push table's
//! endpoint (`url` or `grpc`), has a default (see `docs/dispatcher.md`). Durations are written `<integer><unit>` with the
//! unit one of `ms`, `s`, `m`, `h`, `d` ("60s", "1m", "10m", "1h").

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Serialize, Serializer};

pub const DEFAULT_BOOTSTRAP_SERVERS: &str = "127.0.0.1:9092";
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:8081";
/// The port of the internal listener (`internal_listen`) unless configured:
/// on the IP `http_listen` names (port 0 when `http_listen`'s is 0).
pub const DEFAULT_INTERNAL_PORT: u16 = 8082;
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(3600);
pub const DEFAULT_RETRY_TIERS: [Duration; 4] = [
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3600),
];
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(300);
pub const DEFAULT_GAP_CAP: u64 = 100_000;
/// Leases out at once on one instance, across its queues, unless
/// `max_in_flight` says: each holds its message in memory until it ends.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 50_000;
/// The largest `max_in_flight`.
pub const MAX_MAX_IN_FLIGHT: usize = 10_000_000;
/// The largest queue `weight`.
pub const MAX_WEIGHT: u32 = 1000;
/// Push requests in flight per queue unless `push.concurrency` says.
pub const DEFAULT_PUSH_CONCURRENCY: u32 = 16;
/// The most `push.concurrency` may be.
pub const MAX_PUSH_CONCURRENCY: u32 = 1000;
/// How long a push request may take unless `push.timeout` says.
pub const DEFAULT_PUSH_TIMEOUT: Duration = Duration::from_secs(30);
/// Consecutive failed pushes that open an endpoint's circuit breaker.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// How long an open breaker waits before its first probe.
pub const DEFAULT_BREAKER_COOLDOWN: Duration = Duration::from_secs(5);
/// The cool-down doubles after each failed probe, up to this.
pub const DEFAULT_BREAKER_COOLDOWN_MAX: Duration = Duration::from_secs(60);
/// A pushed message's lease outlives the request timeout by this much (or
/// less when `max_lease` is shorter), so the outcome is acked or nacked
/// before the lease runs out.
pub const PUSH_LEASE_MARGIN: Duration = Duration::from_secs(5);
/// The shortest receipt secret accepted (bytes): receipts are MACed with it.
pub const MIN_SECRET_BYTES: usize = 16;
/// Kafka's limit on topic name length.
const MAX_TOPIC_NAME_CHARS: usize = 249;

/// librdkafka properties the dispatcher sets itself; a `[librdkafka]` table
/// may not override them, because the delivery guarantees depend on them.
const RESERVED_CLIENT_PROPERTIES: [&str; 6] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "acks",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub bootstrap_servers: String,
    pub http_listen: SocketAddr,
    pub grpc_listen: SocketAddr,
    /// `host:port` of this instance's HTTP API as others reach it. Only its
    /// host is used: for `advertised_internal` when that is not set and
    /// `internal_listen` names no single address.
    pub advertised_http: Option<String>,
    /// Where the routes other instances forward to (`/internal/...`) are
    /// served; never on `http_listen`.
    pub internal_listen: SocketAddr,
    /// `host:port` other instances reach `internal_listen` at, to forward
    /// requests for the partitions this one owns. `None`: derived at start
    /// (see `crate::run`).
    pub advertised_internal: Option<String>,
    pub receipt_secret: ReceiptSecret,
    /// Extra librdkafka properties given to every Kafka client (e.g.
    /// `security.protocol`), minus the reserved ones.
    pub librdkafka: BTreeMap<String, String>,
    /// Leases out at once on this instance, all queues together; when they
    /// are, receives wait and the freed room is shared by the queues'
    /// weights (`queue::fair`).
    pub max_in_flight: usize,
    pub queues: Vec<QueueConfig>,
    /// `[tls]`: TLS (and optionally mTLS) on the HTTP and gRPC listeners.
    pub tls: Option<TlsConfig>,
    /// `[auth]`: callers must authenticate; queues grant actions.
    pub auth: Option<AuthConfig>,
    /// `[internal]`: how instances authenticate to each other's internal
    /// listener.
    pub internal: InternalConfig,
}

/// `[tls]` (docs/dispatcher/security.md). Relative paths are taken from the
/// configuration file's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate chain, leaf first (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CA certificates client certificates are verified against (mTLS).
    pub client_ca_file: Option<PathBuf>,
    /// With `client_ca_file`: whether a client must show a certificate.
    pub client_cert_required: bool,
}

/// `[auth]`: callers' credentials and the queues' grants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuthConfig {
    /// From `tokens` and `tokens_file`.
    pub tokens: Vec<TokenHash>,
    /// `[auth.jwt]`: caller JWTs verified against a JWKS.
    pub jwt: Option<JwtConfig>,
    /// `[[auth.queue]]`.
    pub queues: Vec<QueueGrant>,
}

/// A bearer token, by its SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenHash {
    pub principal: String,
    pub sha256: [u8; 32],
}

impl fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenHash({:?})", self.principal)
    }
}

/// `[auth.jwt]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    pub jwks_file: PathBuf,
    /// The `iss` a token must have, when set.
    pub issuer: Option<String>,
    /// An `aud` a token must have, when set.
    pub audience: Option<String>,
    /// The claim naming the principal (default `sub`).
    pub principal_claim: String,
}

/// One `[[auth.queue]]`: who may do what with a queue (`name = "*"`: every
/// queue). A principal `"*"` is any authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueGrant {
    pub queue: String,
    pub produce: Vec<String>,
    pub receive: Vec<String>,
    pub admin: Vec<String>,
}

/// `[internal]`: the credential of the internal listener (what forwarding
/// peers call). Every instance of a deployment has the same.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InternalConfig {
    /// Sent by the forwarding client, required by the internal listener.
    pub secret: Option<Vec<u8>>,
    /// Serve the internal listener over TLS with `[tls]`'s certificate (and
    /// require a client certificate from `client_ca_file` when set).
    pub tls: bool,
    /// The CAs the forwarding client trusts for peers' internal listeners.
    pub ca_file: Option<PathBuf>,
    /// mTLS on the internal listener: peers must show a certificate signed
    /// by one of these CAs.
    pub client_ca_file: Option<PathBuf>,
    /// The certificate and key the forwarding client shows (mTLS).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// One work queue: a topic consumed as a consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueConfig {
    pub name: String,
    pub topic: String,
    pub group: String,
    #[serde(serialize_with = "ser_duration")]
    pub lease: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub max_lease: Duration,
    #[serde(serialize_with = "ser_durations")]
    pub retry_tiers: Vec<Duration>,
    pub max_attempts: u32,
    pub dlq_topic: String,
    pub ack_log_topic: String,
    /// Compacted topic of the message ids accepted by produce, read at start
    /// (and followed) so the dedupe window survives restarts and spans
    /// instances.
    pub dedupe_topic: String,
    /// Per-key order (issue 8, `queue::ordered`): one message in flight per
    /// key per primary partition, retries kept in the partition.
    pub ordered: bool,
    #[serde(serialize_with = "ser_duration")]
    pub dedupe_window: Duration,
    pub gap_cap: u64,
    /// The queue's share of the instance's in-flight budget when it is
    /// spent, relative to the other queues' weights.
    pub weight: u32,
    /// `[queue.push]`: deliver to an endpoint instead of (or besides) pull
    /// receives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<PushConfig>,
}

/// A queue's push subscription (`[queue.push]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PushConfig {
    pub endpoint: PushEndpoint,
    /// Requests in flight at most.
    pub concurrency: u32,
    /// How long one request may take; a timeout is a retryable failure.
    #[serde(serialize_with = "ser_duration")]
    pub timeout: Duration,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    #[serde(serialize_with = "ser_duration")]
    pub breaker_cooldown: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub breaker_cooldown_max: Duration,
    /// CA certificates (PEM) an `https://` endpoint is verified against
    /// instead of the system's.
    #[serde(skip)]
    pub ca_file: Option<PathBuf>,
    /// `[queue.push.auth]`: how each request is signed.
    #[serde(skip)]
    pub auth: PushAuth,
}

/// A signed push JWT is valid this long unless `lifetime` says.
pub const DEFAULT_PUSH_JWT_LIFETIME: Duration = Duration::from_secs(300);
/// The header of a push's HMAC signature unless `header` says.
pub const DEFAULT_PUSH_HMAC_HEADER: &str = "dispatcher-signature";

/// How a push subscription's requests are authenticated to its endpoint
/// (docs/dispatcher/security.md); either, both or neither.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushAuth {
    pub jwt: Option<PushJwt>,
    pub hmac: Option<PushHmac>,
}

/// `[queue.push.auth.jwt]`: an `authorization: Bearer <JWT>` per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushJwt {
    /// The signing key (PEM; RSA for RS256, P-256 for ES256).
    pub key_file: PathBuf,
    /// `RS256` or `ES256`.
    pub algorithm: String,
    /// `aud`: the endpoint URL unless set.
    pub audience: String,
    /// `iss`.
    pub issuer: String,
    /// `kid` in the JWT header, when set.
    pub key_id: Option<String>,
    /// `exp` - `iat`.
    pub lifetime: Duration,
}

/// `[queue.push.auth.hmac]`: `<header>: t=<unix s>,v1=<hex HMAC-SHA256>`.
#[derive(Clone, PartialEq, Eq)]
pub struct PushHmac {
    pub secret: Vec<u8>,
    /// Lowercase.
    pub header: String,
}

impl fmt::Debug for PushHmac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PushHmac")
            .field("secret", &format_args!("<{} bytes>", self.secret.len()))
            .field("header", &self.header)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PushEndpoint {
    /// `url = "http://..."`: a POST per message.
    Http(String),
    /// `grpc = "host:port"`: `dispatcher.push.v1.PushEndpoint/Deliver` per
    /// message, over plaintext HTTP/2.
    Grpc(String),
}

impl PushEndpoint {
    /// The endpoint as configured: the URL, or `host:port` (the metrics'
    /// `endpoint` label).
    pub fn label(&self) -> &str {
        match self {
            PushEndpoint::Http(url) => url,
            PushEndpoint::Grpc(address) => address,
        }
    }

    /// The endpoint as it may be shown (metrics, `GET /queues`): a URL
    /// without its user name and password.
    pub fn redacted(&self) -> String {
        match self {
            PushEndpoint::Http(url) => match reqwest::Url::parse(url) {
                Ok(mut u) => {
                    let _ = u.set_username("");
                    let _ = u.set_password(None);
                    u.to_string()
                }
                Err(_) => url.clone(),
            },
            PushEndpoint::Grpc(address) => address.clone(),
        }
    }
}

impl PushConfig {
    /// The lease a pushed message is received with: the request timeout
    /// plus [`PUSH_LEASE_MARGIN`], at most `max_lease` (which validation
    /// keeps longer than the timeout).
    pub fn lease(&self, max_lease: Duration) -> Duration {
        (self.timeout + PUSH_LEASE_MARGIN).min(max_lease)
    }
}

impl QueueConfig {
    /// The topic of the retry tier with this delay: `<topic>.retry.<tier>`.
    pub fn retry_topic(&self, tier: Duration) -> String {
        format!("{}.retry.{}", self.topic, format_duration(tier))
    }

    /// Ordered queues: the topic a parked key's later messages are held
    /// in until the key is released (issue 8).
    pub fn hold_topic(&self) -> String {
        format!("{}.hold", self.topic)
    }

    /// The queue's control topic: its pause state (`kafka::control`).
    pub fn control_topic(&self) -> String {
        format!("{}.control", self.topic)
    }

    /// Every retry tier's topic, in tier order.
    pub fn retry_topics(&self) -> Vec<String> {
        self.retry_tiers
            .iter()
            .map(|t| self.retry_topic(*t))
            .collect()
    }
}

/// The key receipts are signed with. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct ReceiptSecret {
    pub key: Vec<u8>,
    pub origin: SecretOrigin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretOrigin {
    File(PathBuf),
    Inline,
    /// None was configured: a random one was made at start. Receipts then do
    /// not survive a restart and are not valid on another instance.
    Generated,
}

impl ReceiptSecret {
    /// The 32-byte MAC key receipts are signed with, derived from the
    /// configured secret (of any length from [`MIN_SECRET_BYTES`]). Every
    /// instance derives the same key from the same secret.
    pub fn mac_key(&self) -> [u8; 32] {
        blake3::derive_key("kafka-rs dispatcher receipt secret v1", &self.key)
    }
}

impl fmt::Debug for ReceiptSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiptSecret")
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .field("origin", &self.origin)
            .finish()
    }
}

/// A configuration error; `Display` is one line naming the file and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    Read {
        file: String,
        error: String,
    },
    Syntax {
        file: String,
        line: Option<usize>,
        message: String,
    },
    Key {
        file: String,
        queue: Option<QueueLabel>,
        key: String,
        problem: Problem,
    },
}

/// Which `[[queue]]` an error is in: its name, or its position when the name
/// itself is missing or wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueLabel {
    Name(String),
    Index(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Missing,
    Unknown,
    WrongType {
        expected: &'static str,
        found: &'static str,
    },
    InvalidDuration(String),
    Invalid(String),
}

impl fmt::Display for QueueLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueLabel::Name(n) => write!(f, "queue {n:?}"),
            QueueLabel::Index(i) => write!(f, "queue #{}", i + 1),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => write!(f, "missing (it has no default)"),
            Problem::Unknown => write!(f, "unknown key"),
            Problem::WrongType { expected, found } => {
                write!(f, "expected {expected}, found {found}")
            }
            Problem::InvalidDuration(s) => write!(
                f,
                "invalid duration {s:?} (write <integer><unit>, unit ms, s, m, h or d)"
            ),
            Problem::Invalid(why) => write!(f, "{why}"),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read { file, error } => write!(f, "{file}: cannot read: {error}"),
            ConfigError::Syntax {
                file,
                line: Some(line),
                message,
            } => write!(f, "{file}: line {line}: {message}"),
            ConfigError::Syntax {
                file,
                line: None,
                message,
            } => write!(f, "{file}: {message}"),
            ConfigError::Key {
                file,
                queue,
                key,
                problem,
            } => {
                write!(f, "{file}: ")?;
                if let Some(q) = queue {
                    write!(f, "{q}: ")?;
                }
                write!(f, "key {key:?}: {problem}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and validates a configuration file. A relative
    /// `receipt_secret_file` is taken relative to the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            file: file.clone(),
            error: e.to_string(),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, &file, dir)
    }

    /// Parses and validates configuration text; `file` only labels errors.
    /// The one I/O is reading `receipt_secret_file` (relative to `base_dir`).
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            ConfigError::Syntax {
                file: file.to_string(),
                line,
                message: one_line(e.message()),
            }
        })?;
        let mut top = Keys::new(file, None, table);
        let bootstrap_servers = top
            .string("bootstrap_servers")?
            .unwrap_or_else(|| DEFAULT_BOOTSTRAP_SERVERS.to_string());
        if bootstrap_servers.trim().is_empty() {
            return Err(top.invalid("bootstrap_servers", "must not be empty"));
        }
        let http_listen = top.socket_addr("http_listen", DEFAULT_HTTP_LISTEN)?;
        let grpc_listen = top.socket_addr("grpc_listen", DEFAULT_GRPC_LISTEN)?;
        let advertised_http = top.string("advertised_http")?;
        if let Some(a) = &advertised_http {
            if let Err(why) = check_host_port(a) {
                return Err(top.invalid("advertised_http", &why));
            }
        }
        let internal_port = if http_listen.port() == 0 {
            0
        } else {
            DEFAULT_INTERNAL_PORT
        };
        let default_internal = SocketAddr::new(http_listen.ip(), internal_port).to_string();
        let internal_listen = top.socket_addr("internal_listen", &default_internal)?;
        if internal_listen.port() != 0
            && (internal_listen == http_listen || internal_listen == grpc_listen)
        {
            return Err(top.invalid(
                "internal_listen",
                &format!("{internal_listen} is already http_listen or grpc_listen"),
            ));
        }
        let advertised_internal = top.string("advertised_internal")?;
        if let Some(a) = &advertised_internal {
            if let Err(why) = check_host_port(a) {
                return Err(top.invalid("advertised_internal", &why));
            }
        }
        let receipt_secret = top.receipt_secret(base_dir)?;
        let librdkafka = top.client_properties("librdkafka")?;
        let max_in_flight = top
            .integer("max_in_flight")?
            .unwrap_or(DEFAULT_MAX_IN_FLIGHT as i64);
        let max_in_flight = match usize::try_from(max_in_flight) {
            Ok(n) if (1..=MAX_MAX_IN_FLIGHT).contains(&n) => n,
            _ => {
                return Err(top.invalid(
                    "max_in_flight",
                    &format!("{max_in_flight} is not a lease count (1 to {MAX_MAX_IN_FLIGHT})"),
                ))
            }
        };
        let tls = match top.table("tls")? {
            None => None,
            Some(table) => Some(parse_tls(file, table, base_dir)?),
        };
        let auth = match top.table("auth")? {
            None => None,
            Some(table) => Some(parse_auth(file, table, base_dir)?),
        };
        let internal = match top.table("internal")? {
            None => InternalConfig::default(),
            Some(table) => parse_internal(file, table, base_dir, tls.is_some())?,
        };
        let queue_tables = top.array_of_tables("queue")?;
        top.finish()?;
        if queue_tables.is_empty() {
            return Err(top.invalid("queue", "no [[queue]] is declared"));
        }

        let mut queues: Vec<QueueConfig> = Vec::new();
        // Every topic a queue writes or reads, so two queues cannot share one.
        let mut topics: HashMap<String, (String, &'static str)> = HashMap::new();
        for (index, table) in queue_tables.into_iter().enumerate() {
            let q = parse_queue(file, index, table, base_dir)?;
            let err = |key: &str, why: String| ConfigError::Key {
                file: file.to_string(),
                queue: Some(QueueLabel::Name(q.name.clone())),
                key: key.to_string(),
                problem: Problem::Invalid(why),
            };
            if queues.iter().any(|o| o.name == q.name) {
                return Err(err("name", format!("duplicate queue name {:?}", q.name)));
            }
            let mut owned: Vec<(String, &'static str)> = vec![
                (q.topic.clone(), "topic"),
                (q.dlq_topic.clone(), "dlq_topic"),
                (q.ack_log_topic.clone(), "ack_log_topic"),
                (q.dedupe_topic.clone(), "dedupe_topic"),
            ];
            owned.extend(q.retry_topics().into_iter().map(|t| (t, "retry_tiers")));
            // The topics named after the queue's topic or DLQ (created by
            // `kafka::topics::plan`), under the key they derive from.
            if q.ordered {
                owned.push((q.hold_topic(), "topic"));
            }
            owned.push((crate::trace::index_topic(&q.topic), "topic"));
            owned.push((crate::redrive::store::state_topic(&q), "dlq_topic"));
            owned.push((q.control_topic(), "topic"));
            for (topic, key) in owned {
                if let Err(why) = check_topic_name(&topic) {
                    return Err(err(key, why));
                }
                if let Some((other, other_key)) = topics.get(&topic) {
                    let whose = if *other == q.name {
                        format!("this queue's {other_key:?}")
                    } else {
                        format!("queue {other:?} ({other_key:?})")
                    };
                    return Err(err(
                        key,
                        format!("topic {topic:?} is already used by {whose}"),
                    ));
                }
                topics.insert(topic, (q.name.clone(), key));
            }
            queues.push(q);
        }
        Ok(Config {
            bootstrap_servers,
            http_listen,
            grpc_listen,
            advertised_http,
            internal_listen,
            advertised_internal,
            receipt_secret,
            librdkafka,
            max_in_flight,
            queues,
            tls,
            auth,
            internal,
        })
    }
}

fn sub_keys<'a>(file: &'a str, prefix: &'static str, table: toml::Table) -> Keys<'a> {
    Keys {
        file,
        queue: None,
        prefix,
        table,
    }
}

fn parse_tls(file: &str, table: toml::Table, base_dir: &Path) -> Result<TlsConfig, ConfigError> {
    let mut keys = sub_keys(file, "tls.", table);
    let cert_file = keys
        .path("cert_file", base_dir)?
        .ok_or_else(|| keys.missing("cert_file"))?;
    let key_file = keys
        .path("key_file", base_dir)?
        .ok_or_else(|| keys.missing("key_file"))?;
    let client_ca_file = keys.path("client_ca_file", base_dir)?;
    let client_auth = keys.string("client_auth")?;
    let client_cert_required = match client_auth.as_deref() {
        None | Some("required") => true,
        Some("optional") => false,
        Some(other) => {
            return Err(keys.invalid(
                "client_auth",
                &format!("{other:?} is not \"required\" or \"optional\""),
            ))
        }
    };
    if client_auth.is_some() && client_ca_file.is_none() {
        return Err(keys.invalid("client_auth", "needs client_ca_file"));
    }
    keys.finish()?;
    Ok(TlsConfig {
        cert_file,
        key_file,
        client_ca_file,
        client_cert_required,
    })
}

fn parse_auth(file: &str, table: toml::Table, base_dir: &Path) -> Result<AuthConfig, ConfigError> {
    let mut keys = sub_keys(file, "auth.", table);
    let mut tokens = Vec::new();
    if let Some(items) = keys.array("tokens")? {
        for item in items {
            let toml::Value::Table(t) = item else {
                return Err(keys.wrong_type("tokens", "{ principal, sha256 } tables", &item));
            };
            let mut tk = sub_keys(file, "auth.tokens.", t);
            let principal = tk
                .string("principal")?
                .ok_or_else(|| tk.missing("principal"))?;
            let hex = tk.string("sha256")?.ok_or_else(|| tk.missing("sha256"))?;
            let sha256 = parse_sha256(&hex).map_err(|why| tk.invalid("sha256", &why))?;
            check_principal(&principal).map_err(|why| tk.invalid("principal", &why))?;
            tk.finish()?;
            tokens.push(TokenHash { principal, sha256 });
        }
    }
    if let Some(path) = keys.path("tokens_file", base_dir)? {
        let text = std::fs::read_to_string(&path).map_err(|e| {
            keys.invalid(
                "tokens_file",
                &format!("cannot read {}: {e}", path.display()),
            )
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: String| {
                keys.invalid(
                    "tokens_file",
                    &format!("{} line {}: {why}", path.display(), n + 1),
                )
            };
            let mut words = line.split_whitespace();
            let (Some(principal), Some(hex), None) = (words.next(), words.next(), words.next())
            else {
                return Err(bad("expected \"<principal> <sha256 hex>\"".into()));
            };
            check_principal(principal).map_err(&bad)?;
            let sha256 = parse_sha256(hex).map_err(&bad)?;
            tokens.push(TokenHash {
                principal: principal.to_string(),
                sha256,
            });
        }
    }
    let jwt = match keys.table("jwt")? {
        None => None,
        Some(t) => {
            let mut jk = sub_keys(file, "auth.jwt.", t);
            let jwks_file = jk
                .path("jwks_file", base_dir)?
                .ok_or_else(|| jk.missing("jwks_file"))?;
            let issuer = jk.string("issuer")?;
            let audience = jk.string("audience")?;
            let principal_claim = jk
                .string("principal_claim")?
                .unwrap_or_else(|| "sub".to_string());
            jk.finish()?;
            Some(JwtConfig {
                jwks_file,
                issuer,
                audience,
                principal_claim,
            })
        }
    };
    if tokens.is_empty() && jwt.is_none() {
        return Err(keys.invalid(
            "tokens",
            "[auth] needs tokens, tokens_file or [auth.jwt]: no caller could authenticate",
        ));
    }
    let mut queues = Vec::new();
    for t in keys.array_of_tables("queue")? {
        let mut qk = sub_keys(file, "auth.queue.", t);
        let queue = qk.string("name")?.ok_or_else(|| qk.missing("name"))?;
        let produce = qk.strings("produce")?.unwrap_or_default();
        let receive = qk.strings("receive")?.unwrap_or_default();
        let admin = qk.strings("admin")?.unwrap_or_default();
        qk.finish()?;
        queues.push(QueueGrant {
            queue,
            produce,
            receive,
            admin,
        });
    }
    keys.finish()?;
    Ok(AuthConfig {
        tokens,
        jwt,
        queues,
    })
}

fn parse_internal(
    file: &str,
    table: toml::Table,
    base_dir: &Path,
    has_tls: bool,
) -> Result<InternalConfig, ConfigError> {
    let mut keys = sub_keys(file, "internal.", table);
    let secret = keys.secret("secret", "secret_file", base_dir)?;
    let tls = keys.boolean("tls")?.unwrap_or(false);
    if tls && !has_tls {
        return Err(keys.invalid("tls", "needs a [tls] table (its certificate is served)"));
    }
    let ca_file = keys.path("ca_file", base_dir)?;
    let client_ca_file = keys.path("client_ca_file", base_dir)?;
    let cert_file = keys.path("cert_file", base_dir)?;
    let key_file = keys.path("key_file", base_dir)?;
    if cert_file.is_some() != key_file.is_some() {
        return Err(keys.invalid("cert_file", "give cert_file and key_file together"));
    }
    if !tls && (ca_file.is_some() || client_ca_file.is_some()) {
        return Err(keys.invalid("tls", "ca_file and client_ca_file need tls = true"));
    }
    if secret.is_none() && client_ca_file.is_none() {
        return Err(keys.invalid(
            "secret",
            "[internal] needs secret, secret_file or client_ca_file (mTLS)",
        ));
    }
    keys.finish()?;
    Ok(InternalConfig {
        secret,
        tls,
        ca_file,
        client_ca_file,
        cert_file,
        key_file,
    })
}

fn parse_sha256(hex: &str) -> Result<[u8; 32], String> {
    let bad = || format!("{hex:?} is not a SHA-256 in hex (64 digits)");
    if hex.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

fn check_principal(p: &str) -> Result<(), String> {
    if p.is_empty() || p == "*" || p.contains(char::is_whitespace) {
        return Err(format!(
            "{p:?} is not a principal name (not empty, not \"*\", no spaces)"
        ));
    }
    Ok(())
}

fn parse_queue(
    file: &str,
    index: usize,
    table: toml::Table,
    base_dir: &Path,
) -> Result<QueueConfig, ConfigError> {
    let mut keys = Keys::new(file, Some(QueueLabel::Index(index)), table);
    let name = keys.string("name")?.ok_or_else(|| keys.missing("name"))?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(keys.invalid(
            "name",
            &format!("{name:?} is not a queue name (letters, digits, '.', '_', '-')"),
        ));
    }
    keys.queue = Some(QueueLabel::Name(name.clone()));
    let topic = keys.string("topic")?.ok_or_else(|| keys.missing("topic"))?;
    let group = keys
        .string("group")?
        .unwrap_or_else(|| format!("{name}-dispatcher"));
    if group.is_empty() {
        return Err(keys.invalid("group", "must not be empty"));
    }
    let lease = keys.duration("lease")?.unwrap_or(DEFAULT_LEASE);
    let max_lease = keys.duration("max_lease")?.unwrap_or(DEFAULT_MAX_LEASE);
    if lease.is_zero() {
        return Err(keys.invalid("lease", "must be greater than 0"));
    }
    if lease > max_lease {
        return Err(keys.invalid(
            "lease",
            &format!(
                "{} is longer than max_lease {}",
                format_duration(lease),
                format_duration(max_lease)
            ),
        ));
    }
    let retry_tiers = keys
        .durations("retry_tiers")?
        .unwrap_or_else(|| DEFAULT_RETRY_TIERS.to_vec());
    if retry_tiers.is_empty() {
        return Err(keys.invalid("retry_tiers", "must name at least one tier"));
    }
    if retry_tiers.iter().any(|t| t.is_zero()) {
        return Err(keys.invalid("retry_tiers", "a tier must be longer than 0"));
    }
    if let Some(w) = retry_tiers.windows(2).find(|w| w[0] >= w[1]) {
        return Err(keys.invalid(
            "retry_tiers",
            &format!(
                "tiers must increase, but {} follows {}",
                format_duration(w[1]),
                format_duration(w[0])
            ),
        ));
    }
    let max_attempts = keys
        .integer("max_attempts")?
        .unwrap_or(DEFAULT_MAX_ATTEMPTS as i64);
    let max_attempts = match u32::try_from(max_attempts) {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(keys.invalid(
                "max_attempts",
                &format!("{max_attempts} is not an attempt count (at least 1)"),
            ))
        }
    };
    let dlq_topic = keys
        .string("dlq_topic")?
        .unwrap_or_else(|| format!("{topic}.dlq"));
    let ack_log_topic = keys
        .string("ack_log_topic")?
        .unwrap_or_else(|| format!("{topic}.acklog"));
    let dedupe_topic = keys
        .string("dedupe_topic")?
        .unwrap_or_else(|| format!("{topic}.dedupe"));
    let ordered = keys.boolean("ordered")?.unwrap_or(false);
    let dedupe_window = keys
        .duration("dedupe_window")?
        .unwrap_or(DEFAULT_DEDUPE_WINDOW);
    let gap_cap = keys.integer("gap_cap")?.unwrap_or(DEFAULT_GAP_CAP as i64);
    let gap_cap = match u64::try_from(gap_cap) {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(keys.invalid(
                "gap_cap",
                &format!("{gap_cap} is not an offset count (at least 1)"),
            ))
        }
    };
    let weight = keys.integer("weight")?.unwrap_or(1);
    let weight = match u32::try_from(weight) {
        Ok(n) if (1..=MAX_WEIGHT).contains(&n) => n,
        _ => {
            return Err(keys.invalid(
                "weight",
                &format!("{weight} is not a weight (1 to {MAX_WEIGHT})"),
            ))
        }
    };
    let push = match keys.table("push")? {
        None => None,
        Some(table) => {
            let mut push_keys = Keys {
                file,
                queue: keys.queue.clone(),
                prefix: "push.",
                table,
            };
            let push = parse_push(&mut push_keys, max_lease, base_dir)?;
            push_keys.finish()?;
            Some(push)
        }
    };
    keys.finish()?;
    Ok(QueueConfig {
        name,
        topic,
        group,
        lease,
        max_lease,
        retry_tiers,
        max_attempts,
        dlq_topic,
        ack_log_topic,
        dedupe_topic,
        ordered,
        dedupe_window,
        gap_cap,
        weight,
        push,
    })
}

/// The keys of a `[queue.push]` table; `max_lease` is the queue's.
fn parse_push(
    keys: &mut Keys<'_>,
    max_lease: Duration,
    base_dir: &Path,
) -> Result<PushConfig, ConfigError> {
    let url = keys.string("url")?;
    let grpc = keys.string("grpc")?;
    let endpoint = match (url, grpc) {
        (Some(_), Some(_)) => return Err(keys.invalid("url", "give url or grpc, not both")),
        (None, None) => {
            return Err(keys.invalid(
                "url",
                "missing: a push table needs url = \"http://...\" or grpc = \"host:port\"",
            ))
        }
        (Some(url), None) => {
            check_push_url(&url).map_err(|why| keys.invalid("url", &why))?;
            PushEndpoint::Http(url)
        }
        (None, Some(address)) => {
            check_host_port(&address).map_err(|why| keys.invalid("grpc", &why))?;
            PushEndpoint::Grpc(address)
        }
    };
    let concurrency = keys
        .integer("concurrency")?
        .unwrap_or(i64::from(DEFAULT_PUSH_CONCURRENCY));
    let concurrency = match u32::try_from(concurrency) {
        Ok(n) if (1..=MAX_PUSH_CONCURRENCY).contains(&n) => n,
        _ => {
            return Err(keys.invalid(
                "concurrency",
                &format!("{concurrency} is not a request count (1 to {MAX_PUSH_CONCURRENCY})"),
            ))
        }
    };
    let timeout = keys.duration("timeout")?.unwrap_or(DEFAULT_PUSH_TIMEOUT);
    if timeout.is_zero() {
        return Err(keys.invalid("timeout", "must be greater than 0"));
    }
    if timeout >= max_lease {
        return Err(keys.invalid(
            "timeout",
            &format!(
                "{} is not shorter than the queue's max_lease {} (a pushed message is leased for \
                 the timeout plus a margin)",
                format_duration(timeout),
                format_duration(max_lease)
            ),
        ));
    }
    let breaker_failures = keys
        .integer("breaker_failures")?
        .unwrap_or(i64::from(DEFAULT_BREAKER_FAILURES));
    let breaker_failures = match u32::try_from(breaker_failures) {
        Ok(n) if n >= 1 => n,
        _ => {
            return Err(keys.invalid(
                "breaker_failures",
                &format!("{breaker_failures} is not a failure count (at least 1)"),
            ))
        }
    };
    let breaker_cooldown = keys
        .duration("breaker_cooldown")?
        .unwrap_or(DEFAULT_BREAKER_COOLDOWN);
    if breaker_cooldown.is_zero() {
        return Err(keys.invalid("breaker_cooldown", "must be greater than 0"));
    }
    let breaker_cooldown_max = keys
        .duration("breaker_cooldown_max")?
        .unwrap_or(DEFAULT_BREAKER_COOLDOWN_MAX.max(breaker_cooldown));
    if breaker_cooldown_max < breaker_cooldown {
        return Err(keys.invalid(
            "breaker_cooldown_max",
            &format!(
                "{} is shorter than breaker_cooldown {}",
                format_duration(breaker_cooldown_max),
                format_duration(breaker_cooldown)
            ),
        ));
    }
    let ca_file = keys.path("ca_file", base_dir)?;
    if ca_file.is_some() && !matches!(&endpoint, PushEndpoint::Http(u) if u.starts_with("https:")) {
        return Err(keys.invalid("ca_file", "only an https:// url takes a ca_file"));
    }
    let auth = match keys.table("auth")? {
        None => PushAuth::default(),
        Some(table) => {
            // The JWT's default audience: the url, or the grpc address as
            // written.
            let url = match &endpoint {
                PushEndpoint::Http(url) => url,
                PushEndpoint::Grpc(address) => address,
            };
            let mut ak = Keys {
                file: keys.file,
                queue: keys.queue.clone(),
                prefix: "push.auth.",
                table,
            };
            let auth = parse_push_auth(&mut ak, url, base_dir)?;
            ak.finish()?;
            auth
        }
    };
    Ok(PushConfig {
        endpoint,
        concurrency,
        timeout,
        breaker_failures,
        breaker_cooldown,
        breaker_cooldown_max,
        ca_file,
        auth,
    })
}

fn parse_push_auth(
    keys: &mut Keys<'_>,
    url: &str,
    base_dir: &Path,
) -> Result<PushAuth, ConfigError> {
    let jwt = match keys.table("jwt")? {
        None => None,
        Some(table) => {
            let mut jk = Keys {
                file: keys.file,
                queue: keys.queue.clone(),
                prefix: "push.auth.jwt.",
                table,
            };
            let key_file = jk
                .path("key_file", base_dir)?
                .ok_or_else(|| jk.missing("key_file"))?;
            let algorithm = jk.string("algorithm")?.unwrap_or_else(|| "RS256".into());
            if !matches!(algorithm.as_str(), "RS256" | "ES256") {
                return Err(
                    jk.invalid("algorithm", &format!("{algorithm:?} is not RS256 or ES256"))
                );
            }
            let audience = jk.string("audience")?.unwrap_or_else(|| url.to_string());
            let issuer = jk.string("issuer")?.unwrap_or_else(|| "dispatcher".into());
            let key_id = jk.string("key_id")?;
            let lifetime = jk
                .duration("lifetime")?
                .unwrap_or(DEFAULT_PUSH_JWT_LIFETIME);
            if lifetime < Duration::from_secs(1) {
                return Err(jk.invalid("lifetime", "must be at least 1s"));
            }
            jk.finish()?;
            Some(PushJwt {
                key_file,
                algorithm,
                audience,
                issuer,
                key_id,
                lifetime,
            })
        }
    };
    let hmac = match keys.table("hmac")? {
        None => None,
        Some(table) => {
            let mut hk = Keys {
                file: keys.file,
                queue: keys.queue.clone(),
                prefix: "push.auth.hmac.",
                table,
            };
            let secret = hk
                .secret("secret", "secret_file", base_dir)?
                .ok_or_else(|| hk.missing("secret"))?;
            let header = hk
                .string("header")?
                .unwrap_or_else(|| DEFAULT_PUSH_HMAC_HEADER.into())
                .to_ascii_lowercase();
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(hk.invalid("header", &format!("{header:?} is not a header name")));
            }
            hk.finish()?;
            Some(PushHmac { secret, header })
        }
    };
    Ok(PushAuth { jwt, hmac })
}

/// An `http://` or `https://host[:port]/path` URL.
fn check_push_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match parsed.scheme() {
        "http" | "https" => {}
        other => return Err(format!("{url:?}: scheme {other:?} is not http or https")),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{url:?} names no host"));
    }
    Ok(())
}

/// Takes keys out of one table, so whatever is left at `finish` is unknown.
struct Keys<'a> {
    file: &'a str,
    queue: Option<QueueLabel>,
    /// Put before every key in an error: `push.` in a queue's push table.
    prefix: &'static str,
    table: toml::Table,
}

impl<'a> Keys<'a> {
    fn new(file: &'a str, queue: Option<QueueLabel>, table: toml::Table) -> Self {
        Keys {
            file,
            queue,
            prefix: "",
            table,
        }
    }

    fn error(&self, key: &str, problem: Problem) -> ConfigError {
        ConfigError::Key {
            file: self.file.to_string(),
            queue: self.queue.clone(),
            key: format!("{}{key}", self.prefix),
            problem,
        }
    }

    fn table(&mut self, key: &str) -> Result<Option<toml::Table>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(other) => Err(self.wrong_type(key, "a table", &other)),
        }
    }

    fn missing(&self, key: &str) -> ConfigError {
        self.error(key, Problem::Missing)
    }

    fn invalid(&self, key: &str, why: &str) -> ConfigError {
        self.error(key, Problem::Invalid(why.to_string()))
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &toml::Value) -> ConfigError {
        self.error(
            key,
            Problem::WrongType {
                expected,
                found: type_name(found),
            },
        )
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(key, "a string", &other)),
        }
    }

    /// A path, relative to `base_dir` unless absolute.
    fn path(&mut self, key: &str, base_dir: &Path) -> Result<Option<PathBuf>, ConfigError> {
        Ok(self.string(key)?.map(|p| base_dir.join(p)))
    }

    fn array(&mut self, key: &str) -> Result<Option<Vec<toml::Value>>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(self.wrong_type(key, "an array", &other)),
        }
    }

    fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.array(key)? {
            None => Ok(None),
            Some(items) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s),
                    other => Err(self.wrong_type(key, "an array of strings", &other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
        }
    }

    /// A secret given inline (`key`) or in a file (`file_key`; trailing
    /// whitespace is not part of it), at least [`MIN_SECRET_BYTES`] long.
    fn secret(
        &mut self,
        key: &str,
        file_key: &str,
        base_dir: &Path,
    ) -> Result<Option<Vec<u8>>, ConfigError> {
        let inline = self.string(key)?;
        let file = self.path(file_key, base_dir)?;
        let secret = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(self.invalid(key, &format!("give {key} or {file_key}, not both")))
            }
            (None, None) => return Ok(None),
            (Some(s), None) => s.into_bytes(),
            (None, Some(path)) => {
                let mut bytes = std::fs::read(&path).map_err(|e| {
                    self.invalid(file_key, &format!("cannot read {}: {e}", path.display()))
                })?;
                while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
                    bytes.pop();
                }
                bytes
            }
        };
        if secret.len() < MIN_SECRET_BYTES {
            return Err(self.invalid(
                key,
                &format!(
                    "the secret has {} bytes, at least {MIN_SECRET_BYTES} are needed",
                    secret.len()
                ),
            ));
        }
        Ok(Some(secret))
    }

    fn integer(&mut self, key: &str) -> Result<Option<i64>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) => Ok(Some(n)),
            Some(other) => Err(self.wrong_type(key, "an integer", &other)),
        }
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Boolean(b)) => Ok(Some(b)),
            Some(other) => Err(self.wrong_type(key, "true or false", &other)),
        }
    }

    fn duration(&mut self, key: &str) -> Result<Option<Duration>, ConfigError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => parse_duration(&s)
                .map(Some)
                .ok_or_else(|| self.error(key, Problem::InvalidDuration(s))),
        }
    }

    fn durations(&mut self, key: &str) -> Result<Option<Vec<Duration>>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => parse_duration(&s)
                        .ok_or_else(|| self.error(key, Problem::InvalidDuration(s))),
                    other => Err(self.wrong_type(key, "an array of duration strings", &other)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.wrong_type(key, "an array of duration strings", &other)),
        }
    }

    fn socket_addr(&mut self, key: &str, default: &str) -> Result<SocketAddr, ConfigError> {
        let s = self.string(key)?.unwrap_or_else(|| default.to_string());
        s.parse().map_err(|_| {
            self.invalid(
                key,
                &format!("{s:?} is not an address (write ip:port, e.g. {default:?})"),
            )
        })
    }

    fn receipt_secret(&mut self, base_dir: &Path) -> Result<ReceiptSecret, ConfigError> {
        let inline = self.string("receipt_secret")?;
        let file = self.string("receipt_secret_file")?;
        let (key_name, secret) = match (inline, file) {
            (Some(_), Some(_)) => {
                return Err(self.invalid(
                    "receipt_secret",
                    "give receipt_secret or receipt_secret_file, not both",
                ))
            }
            (Some(s), None) => (
                "receipt_secret",
                ReceiptSecret {
                    key: s.into_bytes(),
                    origin: SecretOrigin::Inline,
                },
            ),
            (None, Some(path)) => {
                let path = base_dir.join(path);
                let mut key = std::fs::read(&path).map_err(|e| {
                    self.invalid(
                        "receipt_secret_file",
                        &format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                // A file written by `echo` ends in a newline that is not part of the key.
                while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
                    key.pop();
                }
                (
                    "receipt_secret_file",
                    ReceiptSecret {
                        key,
                        origin: SecretOrigin::File(path),
                    },
                )
            }
            (None, None) => {
                let mut key = vec![0u8; 32];
                getrandom::fill(&mut key).map_err(|e| {
                    self.invalid(
                        "receipt_secret",
                        &format!("none configured and no randomness to make one: {e}"),
                    )
                })?;
                return Ok(ReceiptSecret {
                    key,
                    origin: SecretOrigin::Generated,
                });
            }
        };
        if secret.key.len() < MIN_SECRET_BYTES {
            return Err(self.invalid(
                key_name,
                &format!(
                    "the secret has {} bytes, at least {MIN_SECRET_BYTES} are needed",
                    secret.key.len()
                ),
            ));
        }
        Ok(secret)
    }

    fn client_properties(&mut self, key: &str) -> Result<BTreeMap<String, String>, ConfigError> {
        let table = match self.table.remove(key) {
            None => return Ok(BTreeMap::new()),
            Some(toml::Value::Table(t)) => t,
            Some(other) => return Err(self.wrong_type(key, "a table", &other)),
        };
        let mut props = BTreeMap::new();
        for (name, value) in table {
            let qualified = format!("{key}.{name}");
            if RESERVED_CLIENT_PROPERTIES.contains(&name.as_str()) {
                return Err(self.invalid(
                    &qualified,
                    "the dispatcher sets this property itself and it cannot be overridden",
                ));
            }
            let value = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(self.wrong_type(&qualified, "a string, integer or boolean", &other))
                }
            };
            props.insert(name, value);
        }
        Ok(props)
    }

    fn array_of_tables(&mut self, key: &str) -> Result<Vec<toml::Table>, ConfigError> {
        match self.table.remove(key) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::Table(t) => Ok(t),
                    other => Err(self.wrong_type(key, "[[queue]] tables", &other)),
                })
                .collect(),
            Some(other) => Err(self.wrong_type(key, "[[queue]] tables", &other)),
        }
    }

    /// Rejects the first key (in file order is not kept; alphabetical) that
    /// nothing took.
    fn finish(&self) -> Result<(), ConfigError> {
        match self.table.keys().next() {
            Some(key) => Err(self.error(key, Problem::Unknown)),
            None => Ok(()),
        }
    }
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a datetime",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `host:port` with a non-empty host of no whitespace, `@` or `/`, and a
/// port number.
fn check_host_port(s: &str) -> Result<(), String> {
    let bad = || format!("{s:?} is not host:port (e.g. \"dispatcher-1.internal:8080\")");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty()
        || host.contains(|c: char| c.is_whitespace() || matches!(c, '@' | '/' | '#'))
        || port.parse::<u16>().is_err()
    {
        return Err(bad());
    }
    Ok(())
}

/// Kafka's rule for topic names: 1-249 characters of `[a-zA-Z0-9._-]`, not
/// `.` or `..`.
fn check_topic_name(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic == "." || topic == ".." {
        return Err(format!("{topic:?} is not a topic name"));
    }
    if topic.len() > MAX_TOPIC_NAME_CHARS {
        return Err(format!(
            "topic {topic:?} is longer than {MAX_TOPIC_NAME_CHARS} characters"
        ));
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "topic {topic:?} has {c:?}; topic names use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// Parses `<integer><unit>`, unit one of `ms`, `s`, `m`, `h`, `d`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let digits = s.find(|c: char| !c.is_ascii_digit())?;
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let unit_ms: u64 = match &s[digits..] {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit_ms).map(Duration::from_millis)
}

/// The shortest exact `<integer><unit>` form: `60s` -> `1m`, `90s` -> `90s`.
/// Retry tier topic names use it, so "60s" and "1m" name the same topic.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

fn ser_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

fn ser_durations<S: Serializer>(ds: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ds.iter().map(|d| format_duration(*d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "dispatcher.toml", Path::new("."))
    }

    /// The sample docker-compose.yml runs must start.
    #[test]
    fn the_shipped_sample_config_is_valid() {
        let c = parse(include_str!("../../config/dispatcher.toml")).unwrap();
        assert_eq!(c.queues.len(), 1);
        assert_eq!(
            (c.queues[0].name.as_str(), c.queues[0].topic.as_str()),
            ("jobs", "jobs")
        );
        assert_eq!(c.receipt_secret.origin, SecretOrigin::Inline);
    }

    fn error(text: &str) -> String {
        let e = parse(text).expect_err("config must be rejected");
        let s = e.to_string();
        assert!(!s.contains('\n'), "error is one line: {s:?}");
        s
    }

    const MINIMAL: &str = "[[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\n";

    #[test]
    fn security_tables_are_optional_and_checked() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(
            (c.tls, c.auth, c.internal),
            (None, None, InternalConfig::default())
        );
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let c = parse(&format!(
            "[tls]\ncert_file = \"s.pem\"\nkey_file = \"s.key\"\nclient_ca_file = \"ca.pem\"\n\
             client_auth = \"optional\"\n\
             [auth]\ntokens = [{{ principal = \"a\", sha256 = \"{hash}\" }}]\n\
             [[auth.queue]]\nname = \"*\"\nadmin = [\"a\"]\n\
             [internal]\nsecret = \"0123456789abcdef\"\n{MINIMAL}"
        ))
        .unwrap();
        let tls = c.tls.unwrap();
        assert!(!tls.client_cert_required);
        assert!(tls.client_ca_file.is_some());
        let auth = c.auth.unwrap();
        assert_eq!(auth.tokens[0].principal, "a");
        assert_eq!(auth.tokens[0].sha256[0], 0x9f);
        assert_eq!(auth.queues[0].admin, vec!["a".to_string()]);
        assert_eq!(c.internal.secret.as_deref(), Some(&b"0123456789abcdef"[..]));

        assert!(error(&format!("[tls]\ncert_file = \"c\"\n{MINIMAL}"))
            .contains("key \"tls.key_file\": missing"));
        assert!(error(&format!("[auth]\n{MINIMAL}")).contains("no caller could authenticate"));
        assert!(error(&format!(
            "[auth]\ntokens = [{{ principal = \"a\", sha256 = \"abc\" }}]\n{MINIMAL}"
        ))
        .contains("key \"auth.tokens.sha256\": \"abc\" is not a SHA-256"));
        assert!(error(&format!(
            "[auth]\ntokens = [{{ principal = \"*\", sha256 = \"{hash}\" }}]\n{MINIMAL}"
        ))
        .contains("is not a principal name"));
        assert!(error(&format!("[internal]\nsecret = \"short\"\n{MINIMAL}"))
            .contains("key \"internal.secret\": the secret has 5 bytes"));
        assert!(error(&format!(
            "[internal]\ntls = true\nsecret = \"0123456789abcdef\"\n{MINIMAL}"
        ))
        .contains("needs a [tls] table"));
        assert!(error(&format!("[internal]\n{MINIMAL}")).contains("needs secret"));
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("60s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("10m"), Some(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Some(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in [
            "", "s", "6x", "1.5h", "-1s", "1 h", "1h30m", "10", "1H", " 1s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        assert_eq!(parse_duration("99999999999999999999s"), None);
        assert_eq!(parse_duration("18446744073709551615h"), None);
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        for s in ["10s", "1m", "10m", "1h", "250ms", "7d"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }

    #[test]
    fn a_queue_with_only_name_and_topic_gets_every_default() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(c.http_listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.grpc_listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(c.internal_listen, "127.0.0.1:8082".parse().unwrap());
        assert_eq!(c.advertised_internal, None);
        assert_eq!(c.receipt_secret.origin, SecretOrigin::Generated);
        assert_eq!(c.receipt_secret.key.len(), 32);
        assert!(c.librdkafka.is_empty());
        let q = &c.queues[0];
        assert_eq!(
            q,
            &QueueConfig {
                name: "jobs".into(),
                topic: "jobs".into(),
                group: "jobs-dispatcher".into(),
                lease: Duration::from_secs(60),
                max_lease: Duration::from_secs(3600),
                retry_tiers: DEFAULT_RETRY_TIERS.to_vec(),
                max_attempts: 5,
                dlq_topic: "jobs.dlq".into(),
                ack_log_topic: "jobs.acklog".into(),
                dedupe_topic: "jobs.dedupe".into(),
                ordered: false,
                dedupe_window: Duration::from_secs(300),
                gap_cap: 100_000,
                weight: 1,
                push: None,
            }
        );
        assert_eq!(
            q.retry_topics(),
            [
                "jobs.retry.10s",
                "jobs.retry.1m",
                "jobs.retry.10m",
                "jobs.retry.1h"
            ]
        );
    }

    #[test]
    fn the_documented_example_parses_as_written() {
        let c = parse(
            r#"
bootstrap_servers = "10.0.0.1:9092,10.0.0.2:9092"
http_listen = "0.0.0.0:8080"
grpc_listen = "0.0.0.0:8081"
receipt_secret = "0123456789abcdef0123"

[librdkafka]
"socket.keepalive.enable" = true
"statistics.interval.ms" = 0

[[queue]]
name = "jobs"
topic = "jobs"
group = "jobs-dispatcher"
lease = "60s"
max_lease = "1h"
retry_tiers = ["10s", "1m", "10m", "1h"]
max_attempts = 5
dlq_topic = "jobs.dlq"
ordered = false
dedupe_window = "5m"
gap_cap = 100000
ack_log_topic = "jobs.acklog"

[[queue]]
name = "emails"
topic = "emails"
lease = "30s"
retry_tiers = ["5s", "30s"]
ordered = false
"#,
        )
        .unwrap();
        assert_eq!(c.bootstrap_servers, "10.0.0.1:9092,10.0.0.2:9092");
        assert_eq!(c.http_listen, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(c.receipt_secret.origin, SecretOrigin::Inline);
        assert_eq!(c.receipt_secret.key, b"0123456789abcdef0123");
        assert_eq!(c.librdkafka["socket.keepalive.enable"], "true");
        assert_eq!(c.librdkafka["statistics.interval.ms"], "0");
        assert_eq!(c.queues.len(), 2);
        assert_eq!(c.queues[0], parse(MINIMAL).unwrap().queues[0]);
        let e = &c.queues[1];
        assert_eq!(e.group, "emails-dispatcher");
        assert_eq!(e.lease, Duration::from_secs(30));
        assert!(!e.ordered);
        assert_eq!(e.retry_topics(), ["emails.retry.5s", "emails.retry.30s"]);
        let ordered = parse(&format!("{MINIMAL}ordered = true\n")).unwrap();
        assert!(
            ordered.queues[0].ordered,
            "ordered queues are built (issue 8)"
        );
    }

    #[test]
    fn queue_config_serializes_durations_as_written() {
        let q = &parse(MINIMAL).unwrap().queues[0];
        let json = serde_json::to_value(q).unwrap();
        assert_eq!(json["lease"], "1m");
        assert_eq!(json["max_lease"], "1h");
        assert_eq!(
            json["retry_tiers"],
            serde_json::json!(["10s", "1m", "10m", "1h"])
        );
        assert_eq!(json["dlq_topic"], "jobs.dlq");
        assert_eq!(json["gap_cap"], 100000);
    }

    #[test]
    fn an_invalid_duration_names_the_queue_and_key() {
        assert_eq!(
            error(&format!("{MINIMAL}lease = \"6x\"\n")),
            "dispatcher.toml: queue \"jobs\": key \"lease\": invalid duration \"6x\" \
             (write <integer><unit>, unit ms, s, m, h or d)"
        );
        assert!(
            error(&format!("{MINIMAL}retry_tiers = [\"10s\", \"soon\"]\n")).starts_with(
                "dispatcher.toml: queue \"jobs\": key \"retry_tiers\": invalid duration \"soon\""
            )
        );
        assert!(error(&format!("{MINIMAL}dedupe_window = \"5\"\n"))
            .contains("key \"dedupe_window\": invalid duration \"5\""));
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        assert_eq!(
            error(&format!("{MINIMAL}leese = \"60s\"\n")),
            "dispatcher.toml: queue \"jobs\": key \"leese\": unknown key"
        );
        assert_eq!(
            error(&format!("http_listne = \"127.0.0.1:1\"\n{MINIMAL}")),
            "dispatcher.toml: key \"http_listne\": unknown key"
        );
    }

    #[test]
    fn missing_name_or_topic_is_an_error_naming_it() {
        assert_eq!(
            error("[[queue]]\ntopic = \"jobs\"\n"),
            "dispatcher.toml: queue #1: key \"name\": missing (it has no default)"
        );
        assert_eq!(
            error(&format!("{MINIMAL}[[queue]]\nname = \"b\"\n")),
            "dispatcher.toml: queue \"b\": key \"topic\": missing (it has no default)"
        );
        assert_eq!(
            error("bootstrap_servers = \"x:1\"\n"),
            "dispatcher.toml: key \"queue\": no [[queue]] is declared"
        );
    }

    #[test]
    fn wrong_types_are_named() {
        assert_eq!(
            error(&format!("{MINIMAL}max_attempts = \"5\"\n")),
            "dispatcher.toml: queue \"jobs\": key \"max_attempts\": expected an integer, found a string"
        );
        assert_eq!(
            error(&format!("{MINIMAL}ordered = 1\n")),
            "dispatcher.toml: queue \"jobs\": key \"ordered\": expected true or false, found an integer"
        );
        assert_eq!(
            error(&format!("{MINIMAL}retry_tiers = \"10s\"\n")),
            "dispatcher.toml: queue \"jobs\": key \"retry_tiers\": expected an array of duration strings, found a string"
        );
        assert!(error("queue = 3\n").contains("key \"queue\": expected [[queue]] tables"));
    }

    #[test]
    fn duplicate_queue_names_are_rejected() {
        assert_eq!(
            error(&format!(
                "{MINIMAL}[[queue]]\nname = \"jobs\"\ntopic = \"other\"\n"
            )),
            "dispatcher.toml: queue \"jobs\": key \"name\": duplicate queue name \"jobs\""
        );
    }

    #[test]
    fn two_queues_cannot_share_a_topic() {
        let e = error(&format!(
            "{MINIMAL}[[queue]]\nname = \"b\"\ntopic = \"b\"\ndlq_topic = \"jobs.dlq\"\n"
        ));
        assert_eq!(
            e,
            "dispatcher.toml: queue \"b\": key \"dlq_topic\": topic \"jobs.dlq\" is already used by queue \"jobs\" (\"dlq_topic\")"
        );
        // A topic another queue derives from its own is taken too.
        let e = error(&format!(
            "{MINIMAL}[[queue]]\nname = \"b\"\ntopic = \"jobs.control\"\n"
        ));
        assert_eq!(
            e,
            "dispatcher.toml: queue \"b\": key \"topic\": topic \"jobs.control\" is already used by queue \"jobs\" (\"topic\")"
        );
        let e = error(&format!(
            "{MINIMAL}[[queue]]\nname = \"b\"\ntopic = \"b\"\ndlq_topic = \"jobs.dlq.redrive\"\n"
        ));
        assert!(
            e.contains("topic \"jobs.dlq.redrive\" is already used by queue \"jobs\""),
            "{e}"
        );
        let e = error(&format!("{MINIMAL}dlq_topic = \"jobs\"\n"));
        assert!(
            e.contains(
                "key \"dlq_topic\": topic \"jobs\" is already used by this queue's \"topic\""
            ),
            "{e}"
        );
    }

    #[test]
    fn max_attempts_must_be_at_least_one() {
        assert!(error(&format!("{MINIMAL}max_attempts = 0\n"))
            .contains("key \"max_attempts\": 0 is not an attempt count (at least 1)"));
        assert!(error(&format!("{MINIMAL}max_attempts = -3\n")).contains("key \"max_attempts\""));
        assert_eq!(
            parse(&format!("{MINIMAL}max_attempts = 1\n"))
                .unwrap()
                .queues[0]
                .max_attempts,
            1
        );
    }

    #[test]
    fn retry_tiers_must_be_non_empty_and_increasing() {
        assert!(error(&format!("{MINIMAL}retry_tiers = []\n"))
            .contains("key \"retry_tiers\": must name at least one tier"));
        assert!(
            error(&format!("{MINIMAL}retry_tiers = [\"1m\", \"10s\"]\n"))
                .contains("key \"retry_tiers\": tiers must increase, but 10s follows 1m")
        );
        // Equal durations written differently would name the same topic.
        assert!(
            error(&format!("{MINIMAL}retry_tiers = [\"60s\", \"1m\"]\n"))
                .contains("tiers must increase, but 1m follows 1m")
        );
        assert!(error(&format!("{MINIMAL}retry_tiers = [\"0s\", \"1m\"]\n"))
            .contains("a tier must be longer than 0"));
        let q = &parse(&format!("{MINIMAL}retry_tiers = [\"90s\"]\n"))
            .unwrap()
            .queues[0];
        assert_eq!(q.retry_topics(), ["jobs.retry.90s"]);
    }

    #[test]
    fn in_flight_budget_and_weights() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.max_in_flight, DEFAULT_MAX_IN_FLIGHT);
        assert_eq!(c.queues[0].weight, 1);
        let c = parse(&format!("max_in_flight = 20\n{MINIMAL}weight = 3\n")).unwrap();
        assert_eq!((c.max_in_flight, c.queues[0].weight), (20, 3));
        assert_eq!(
            error(&format!("max_in_flight = 0\n{MINIMAL}")),
            "dispatcher.toml: key \"max_in_flight\": 0 is not a lease count (1 to 10000000)"
        );
        assert!(error(&format!("{MINIMAL}weight = 0\n")).contains("key \"weight\": 0 is not"));
        assert!(error(&format!("{MINIMAL}weight = 1001\n")).contains("key \"weight\""));
    }

    #[test]
    fn lease_must_not_exceed_max_lease() {
        assert_eq!(
            error(&format!("{MINIMAL}lease = \"2h\"\n")),
            "dispatcher.toml: queue \"jobs\": key \"lease\": 2h is longer than max_lease 1h"
        );
        assert!(error(&format!("{MINIMAL}lease = \"0s\"\n")).contains("must be greater than 0"));
        let q = &parse(&format!("{MINIMAL}lease = \"1h\"\n")).unwrap().queues[0];
        assert_eq!(q.lease, q.max_lease);
    }

    #[test]
    fn gap_cap_must_be_positive() {
        assert!(error(&format!("{MINIMAL}gap_cap = 0\n")).contains("key \"gap_cap\""));
    }

    #[test]
    fn bad_topic_and_queue_names_are_rejected() {
        assert!(error("[[queue]]\nname = \"jobs\"\ntopic = \"a b\"\n")
            .contains("queue \"jobs\": key \"topic\": topic \"a b\" has ' '"));
        assert!(error("[[queue]]\nname = \"a/b\"\ntopic = \"x\"\n")
            .starts_with("dispatcher.toml: queue #1: key \"name\": \"a/b\" is not a queue name"));
        // The longest derived name (a retry tier) must fit too.
        let long = "t".repeat(240);
        assert!(
            error(&format!("[[queue]]\nname = \"q\"\ntopic = \"{long}\"\n"))
                .contains("key \"retry_tiers\": topic")
        );
    }

    #[test]
    fn listen_addresses_are_checked() {
        assert!(error(&format!("http_listen = \"localhost\"\n{MINIMAL}"))
            .starts_with("dispatcher.toml: key \"http_listen\": \"localhost\" is not an address"));
        assert!(error(&format!("grpc_listen = 8081\n{MINIMAL}"))
            .contains("key \"grpc_listen\": expected a string, found an integer"));
        assert!(error(&format!("bootstrap_servers = \"\"\n{MINIMAL}"))
            .contains("key \"bootstrap_servers\": must not be empty"));
        for bad in ["nohost", ":8080", "a b:1", "h:port", "h:70000", "x@y:1"] {
            assert!(
                error(&format!("advertised_http = \"{bad}\"\n{MINIMAL}"))
                    .contains("key \"advertised_http\": "),
                "{bad}"
            );
        }
        let c = parse(&format!(
            "advertised_http = \"d-1.internal:8080\"\n{MINIMAL}"
        ))
        .unwrap();
        assert_eq!(c.advertised_http.as_deref(), Some("d-1.internal:8080"));
        assert_eq!(parse(MINIMAL).unwrap().advertised_http, None);
    }

    #[test]
    fn the_internal_listener_is_its_own() {
        let c = parse(&format!("http_listen = \"0.0.0.0:9000\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.internal_listen, "0.0.0.0:8082".parse().unwrap());
        let c = parse(&format!("http_listen = \"127.0.0.2:0\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.internal_listen, "127.0.0.2:0".parse().unwrap());
        let c = parse(&format!(
            "internal_listen = \"10.0.0.7:9100\"\nadvertised_internal = \"d-1.internal:9100\"\n{MINIMAL}"
        ))
        .unwrap();
        assert_eq!(c.internal_listen, "10.0.0.7:9100".parse().unwrap());
        assert_eq!(c.advertised_internal.as_deref(), Some("d-1.internal:9100"));
        assert!(
            error(&format!("internal_listen = \"127.0.0.1:8080\"\n{MINIMAL}"))
                .contains("key \"internal_listen\": 127.0.0.1:8080 is already http_listen")
        );
        for bad in ["nohost", "h:port", "x#y:1"] {
            assert!(
                error(&format!("advertised_internal = \"{bad}\"\n{MINIMAL}"))
                    .contains("key \"advertised_internal\": "),
                "{bad}"
            );
        }
    }

    #[test]
    fn syntax_errors_are_one_line_with_the_line_number() {
        let e = error("bootstrap_servers = \"a\"\n[[queue]\nname = 1\n");
        assert!(e.starts_with("dispatcher.toml: line 2: "), "{e}");
    }

    #[test]
    fn reserved_client_properties_cannot_be_overridden() {
        assert_eq!(
            error(&format!("[librdkafka]\n\"enable.auto.commit\" = true\n{MINIMAL}")),
            "dispatcher.toml: key \"librdkafka.enable.auto.commit\": the dispatcher sets this property itself and it cannot be overridden"
        );
        assert!(
            error(&format!("[librdkafka]\n\"x\" = [1]\n{MINIMAL}")).contains(
                "key \"librdkafka.x\": expected a string, integer or boolean, found an array"
            )
        );
    }

    #[test]
    fn the_receipt_secret_comes_from_a_file_relative_to_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "0123456789abcdefXYZ\n").unwrap();
        std::fs::write(
            dir.path().join("dispatcher.toml"),
            format!("receipt_secret_file = \"secret\"\n{MINIMAL}"),
        )
        .unwrap();
        let c = Config::load(&dir.path().join("dispatcher.toml")).unwrap();
        assert_eq!(c.receipt_secret.key, b"0123456789abcdefXYZ");
        assert_eq!(
            c.receipt_secret.origin,
            SecretOrigin::File(dir.path().join("secret"))
        );
        assert!(
            !format!("{c:?}").contains("0123456789abcdef"),
            "Debug hides the key"
        );

        let e = Config::parse(
            &format!("receipt_secret_file = \"nope\"\n{MINIMAL}"),
            "d.toml",
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("d.toml: key \"receipt_secret_file\": cannot read "),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_short_or_doubled_receipt_secret_is_rejected() {
        assert!(error(&format!("receipt_secret = \"short\"\n{MINIMAL}"))
            .contains("key \"receipt_secret\": the secret has 5 bytes, at least 16 are needed"));
        assert!(error(&format!(
            "receipt_secret = \"0123456789abcdef\"\nreceipt_secret_file = \"x\"\n{MINIMAL}"
        ))
        .contains("not both"));
    }

    #[test]
    fn generated_secrets_differ() {
        let a = parse(MINIMAL).unwrap().receipt_secret;
        let b = parse(MINIMAL).unwrap().receipt_secret;
        assert_ne!(a.key, b.key);
    }

    #[test]
    fn a_push_table_gets_its_defaults() {
        let q = &parse(&format!(
            "{MINIMAL}[queue.push]\nurl = \"http://127.0.0.1:9000/jobs\"\n"
        ))
        .unwrap()
        .queues[0];
        let push = q.push.as_ref().unwrap();
        assert_eq!(
            push,
            &PushConfig {
                endpoint: PushEndpoint::Http("http://127.0.0.1:9000/jobs".into()),
                concurrency: 16,
                timeout: Duration::from_secs(30),
                breaker_failures: 5,
                breaker_cooldown: Duration::from_secs(5),
                breaker_cooldown_max: Duration::from_secs(60),
                ca_file: None,
                auth: PushAuth::default(),
            }
        );
        assert_eq!(push.lease(q.max_lease), Duration::from_secs(35));
        assert_eq!(push.endpoint.label(), "http://127.0.0.1:9000/jobs");
        assert_eq!(
            PushEndpoint::Http("http://u:secret@h:1/p?q=1".into()).redacted(),
            "http://h:1/p?q=1"
        );
        assert_eq!(PushEndpoint::Grpc("h:2".into()).redacted(), "h:2");
        assert_eq!(parse(MINIMAL).unwrap().queues[0].push, None);
    }

    #[test]
    fn a_push_table_takes_every_key() {
        let q = &parse(&format!(
            "{MINIMAL}lease = \"5s\"\nmax_lease = \"10s\"\n[queue.push]\ngrpc = \"push-target:50051\"\n\
             concurrency = 3\ntimeout = \"8s\"\nbreaker_failures = 2\n\
             breaker_cooldown = \"500ms\"\nbreaker_cooldown_max = \"4s\"\n"
        ))
        .unwrap()
        .queues[0];
        let push = q.push.as_ref().unwrap();
        assert_eq!(
            push.endpoint,
            PushEndpoint::Grpc("push-target:50051".into())
        );
        assert_eq!(push.concurrency, 3);
        assert_eq!(push.timeout, Duration::from_secs(8));
        assert_eq!(push.breaker_failures, 2);
        assert_eq!(push.breaker_cooldown, Duration::from_millis(500));
        assert_eq!(push.breaker_cooldown_max, Duration::from_secs(4));
        // The margin is cut to what max_lease leaves.
        assert_eq!(push.lease(q.max_lease), Duration::from_secs(10));
        let json = serde_json::to_value(q).unwrap();
        assert_eq!(json["push"]["timeout"], "8s");
        assert_eq!(json["push"]["endpoint"]["grpc"], "push-target:50051");
    }

    #[test]
    fn push_errors_name_the_key() {
        let push = |keys: &str| error(&format!("{MINIMAL}[queue.push]\n{keys}\n"));
        assert_eq!(
            push("url = \"http://h:1/\"\nconcurency = 4"),
            "dispatcher.toml: queue \"jobs\": key \"push.concurency\": unknown key"
        );
        assert!(push("concurrency = 4").contains(
            "key \"push.url\": missing: a push table needs url = \"http://...\" or grpc = \"host:port\""
        ));
        assert!(push("url = \"http://h:1/\"\ngrpc = \"h:2\"").contains("not both"));
        assert!(push("url = \"http://h/\"\nca_file = \"ca.pem\"")
            .contains("key \"push.ca_file\": only an https:// url takes a ca_file"));
        assert!(
            push("url = \"https://h/\"\n[queue.push.auth.hmac]\nsecret = \"short\"")
                .contains("key \"push.auth.hmac.secret\": the secret has 5 bytes")
        );
        assert!(push("url = \"h:1\"")
            .contains("key \"push.url\": \"h:1\": scheme \"h\" is not http or https"));
        assert!(
            push("url = \"not a url\"").contains("key \"push.url\": \"not a url\" is not a URL")
        );
        assert!(push("grpc = \"http://h:1\"").contains("key \"push.grpc\": "));
        assert!(push("url = \"http://h/\"\nconcurrency = 0")
            .contains("key \"push.concurrency\": 0 is not a request count (1 to 1000)"));
        assert!(push("url = \"http://h/\"\nconcurrency = 1001").contains("push.concurrency"));
        assert!(push("url = \"http://h/\"\ntimeout = \"0s\"")
            .contains("push.timeout\": must be greater than 0"));
        assert_eq!(
            push("url = \"http://h/\"\ntimeout = \"1h\""),
            "dispatcher.toml: queue \"jobs\": key \"push.timeout\": 1h is not shorter than the \
             queue's max_lease 1h (a pushed message is leased for the timeout plus a margin)"
        );
        assert!(push("url = \"http://h/\"\ntimeout = \"5\"")
            .contains("push.timeout\": invalid duration \"5\""));
        assert!(push("url = \"http://h/\"\nbreaker_failures = 0").contains("push.breaker_failures"));
        assert!(push("url = \"http://h/\"\nbreaker_cooldown = \"0s\"")
            .contains("push.breaker_cooldown\""));
        assert!(push(
            "url = \"http://h/\"\nbreaker_cooldown = \"10s\"\nbreaker_cooldown_max = \"5s\""
        )
        .contains("key \"push.breaker_cooldown_max\": 5s is shorter than breaker_cooldown 10s"));
        assert!(error(&format!("{MINIMAL}push = \"http://h/\"\n"))
            .contains("key \"push\": expected a table, found a string"));
        // A long cool-down raises the default maximum with it.
        let q = &parse(&format!(
            "{MINIMAL}[queue.push]\nurl = \"http://h/\"\nbreaker_cooldown = \"2m\"\n"
        ))
        .unwrap()
        .queues[0];
        assert_eq!(
            q.push.as_ref().unwrap().breaker_cooldown_max,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn a_missing_file_is_one_line() {
        let e = Config::load(Path::new("/nonexistent/dispatcher.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/nonexistent/dispatcher.toml: cannot read: "),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }
}
