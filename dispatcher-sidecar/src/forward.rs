//! Serving receipts of partitions another instance owns (issue 7): a client
//! may send an ack, nack or extend to any instance, whichever served its
//! receive.
//!
//! [`Forwarding`] wraps the local [`QueueService`]. The local service answers
//! `NotOwner` for a receipt whose partition it does not own; for those the
//! wrapper finds the owner in the queue's consumer group and sends the
//! request to the owner's internal listener (`internal_listen`, routes under
//! `/internal`, which the public listener does not serve), where the owner's
//! *local* service answers it (never forwarded again, so a stale view of the
//! group cannot make requests bounce between instances).
//!
//! Finding the owner needs no registry of its own: every dispatcher consumer
//! sets its Kafka `client.id` to
//! `dispatcher-<queue>@<advertised internal address>#<tag>`
//! (`kafka::consumer_config`), and DescribeGroups returns each member's client
//! id and assignment. The tag is a MAC of the queue and the address under a
//! key derived from the receipt secret the instances share
//! ([`AddressSigner`]): any Kafka client can join the queue's group with any
//! client id, but only an instance that holds the secret can name an
//! address, so a stranger cannot have acks, nacks (and the receipts they
//! carry) forwarded to a URL of its choosing. A member whose address does not
//! verify is never forwarded to; it is logged once and counted
//! (`dispatcher_group_unverified_members`). The answer is cached for a second;
//! a miss, or an owner that is this instance (the cache is older than a
//! rebalance), refreshes it once. When no owner is found or it cannot be
//! reached, the outcome stays `NotOwner`: the partition is moving, and the
//! client retries, or its lease runs out and the message is delivered again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use kafka_protocol::messages::ConsumerProtocolAssignment;
use kafka_protocol::protocol::Decodable as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use serde::{Deserialize, Serialize};

use crate::config::{Config, QueueConfig};
use crate::lease::ReceiptCodec;
use crate::redrive::{RedriveAction, RedriveError, RedriveJob, RedriveRequest};
use crate::service::{
    Delivery, ExtendResult, NackRequest, NewMessage, ParkedKeyInfo, ProduceResult, QueueService,
    QueueStats, ReceiptOutcome, ReceiveRequest, ServiceError, SkipOutcome, SkipRequest,
};
use crate::trace::{MessageTrace, Source, Status, TraceResponse};

/// The path prefix of the routes that serve the local service only.
pub const INTERNAL_PREFIX: &str = "/internal";
/// How long a view of a group's owners is used before it is fetched again.
const OWNERS_TTL: Duration = Duration::from_secs(1);
/// A view younger than this is not refetched on a miss (bounds DescribeGroups
/// traffic when a partition simply has no owner during a rebalance).
const OWNERS_MIN_REFRESH: Duration = Duration::from_millis(200);
const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Signs the address an instance advertises in its consumers' client ids,
/// and verifies the ones other members of a group advertise.
#[derive(Clone)]
pub struct AddressSigner {
    key: [u8; 32],
}

impl std::fmt::Debug for AddressSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddressSigner { key: <redacted> }")
    }
}

/// Why a group member's client id names no address to forward to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unverified {
    /// Not of the form `dispatcher-<queue>@<address>#<tag>`: another Kafka
    /// client in the group, or a dispatcher that advertises no address.
    NotDispatcher,
    /// The form without a tag: a dispatcher older than signed addresses.
    Unsigned,
    /// A tag that does not verify: another receipt secret, or a forgery.
    BadTag,
}

/// Bytes of the MAC in a client id (hex: twice as many characters).
const ADDRESS_TAG_BYTES: usize = 16;

impl AddressSigner {
    /// The key is derived from the receipt secret, apart from the receipt
    /// keys, so every instance with the same secret signs alike.
    pub fn new(secret: &crate::config::ReceiptSecret) -> Self {
        AddressSigner {
            key: blake3::derive_key("kafka-rs dispatcher owner address v1", &secret.key),
        }
    }

    fn tag(&self, queue: &str, addr: &str) -> [u8; ADDRESS_TAG_BYTES] {
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(queue.as_bytes());
        hasher.update(b"\0");
        hasher.update(addr.as_bytes());
        let mut tag = [0u8; ADDRESS_TAG_BYTES];
        tag.copy_from_slice(&hasher.finalize().as_bytes()[..ADDRESS_TAG_BYTES]);
        tag
    }

    /// The client id of `queue`'s consumers on an instance reached at
    /// `addr`: `dispatcher-<queue>@<addr>#<tag>`.
    pub fn client_id(&self, queue: &str, addr: &str) -> String {
        let tag: String = self
            .tag(queue, addr)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("dispatcher-{queue}@{addr}#{tag}")
    }

    /// The address a member's client id names, if its tag verifies.
    pub fn verify<'a>(&self, client_id: &'a str) -> Result<&'a str, Unverified> {
        let rest = client_id
            .strip_prefix("dispatcher-")
            .ok_or(Unverified::NotDispatcher)?;
        let (queue, signed) = rest.split_once('@').ok_or(Unverified::NotDispatcher)?;
        let Some((addr, tag)) = signed.rsplit_once('#') else {
            return Err(if signed.is_empty() {
                Unverified::NotDispatcher
            } else {
                Unverified::Unsigned
            });
        };
        if addr.is_empty() || tag.len() != 2 * ADDRESS_TAG_BYTES {
            return Err(Unverified::BadTag);
        }
        let mut given = [0u8; ADDRESS_TAG_BYTES];
        for (i, byte) in given.iter_mut().enumerate() {
            *byte = tag
                .get(2 * i..2 * i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(Unverified::BadTag)?;
        }
        // Compared in constant time: the tag is a MAC.
        let want = self.tag(queue, addr);
        let diff = want
            .iter()
            .zip(given.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff == 0 {
            Ok(addr)
        } else {
            Err(Unverified::BadTag)
        }
    }
}

/// The address a dispatcher's client id claims, verified or not (what
/// follows `@`, without the tag).
fn claimed_address(client_id: &str) -> &str {
    let signed = client_id.split_once('@').map_or(client_id, |(_, s)| s);
    signed.rsplit_once('#').map_or(signed, |(addr, _)| addr)
}

/// Group members already logged as unverified (bounded: past it, no more
/// log lines, the gauge still counts them).
const MAX_WARNED_MEMBERS: usize = 1024;

/// The (topic, partition) pairs of a member assignment in Kafka's consumer
/// protocol (the bytes DescribeGroups returns).
pub fn parse_assignment(bytes: &[u8]) -> anyhow::Result<Vec<(String, i32)>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    anyhow::ensure!(bytes.len() >= 2, "assignment of {} bytes", bytes.len());
    let version = i16::from_be_bytes([bytes[0], bytes[1]]);
    // Any member of the group sets these bytes, and the decoder allocates
    // from the counts they declare before reading what they count.
    check_assignment_layout(&bytes[2..])?;
    // Versions 0-3 share one layout; a later one is read as the newest known.
    let mut buf = Bytes::copy_from_slice(&bytes[2..]);
    let assignment = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3))
        .context("decoding a consumer-protocol assignment")?;
    Ok(assignment
        .assigned_partitions
        .into_iter()
        .flat_map(|tp| {
            let topic = tp.topic.0.to_string();
            tp.partitions.into_iter().map(move |p| (topic.clone(), p))
        })
        .collect())
}

/// Checks that every count and length of a consumer-protocol assignment
/// (v0-3: topics of a name and partition numbers, then nullable user data)
/// fits in the bytes that follow it.
fn check_assignment_layout(mut b: &[u8]) -> anyhow::Result<()> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
        anyhow::ensure!(
            n <= b.len(),
            "assignment declares {n} bytes, {} remain",
            b.len()
        );
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn int(b: &mut &[u8]) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(take(b, 4)?.try_into().expect("4 bytes")))
    }
    let topics = int(&mut b)?;
    // A topic is at least a 2-byte name length and a 4-byte count.
    anyhow::ensure!(
        topics >= 0 && topics as usize <= b.len() / 6,
        "assignment declares {topics} topics in {} bytes",
        b.len()
    );
    for _ in 0..topics {
        let name = i16::from_be_bytes(take(&mut b, 2)?.try_into().expect("2 bytes"));
        anyhow::ensure!(name >= 0, "assignment topic name of length {name}");
        take(&mut b, name as usize)?;
        let partitions = int(&mut b)?;
        anyhow::ensure!(
            partitions >= -1,
            "assignment declares {partitions} partitions"
        );
        take(&mut b, partitions.max(0) as usize * 4)?;
    }
    if !b.is_empty() {
        let user_data = int(&mut b)?;
        anyhow::ensure!(
            user_data >= -1,
            "assignment user data of length {user_data}"
        );
        take(&mut b, user_data.max(0) as usize)?;
    }
    Ok(())
}

/// Who owns which partition, per consumer group, from DescribeGroups.
pub struct Owners {
    client: Arc<BaseConsumer>,
    views: Mutex<HashMap<String, View>>,
    signer: AddressSigner,
    /// The queue each group serves (the metrics' label).
    queues: HashMap<String, String>,
    /// (group, member id) pairs logged as unverified.
    warned: Arc<Mutex<std::collections::HashSet<(String, String)>>>,
}

#[derive(Clone)]
struct View {
    fetched: Instant,
    owners: Arc<HashMap<(String, i32), String>>,
    /// Every dispatcher instance in the group, assigned partitions or not.
    members: Arc<Vec<String>>,
    /// Instances (by the address they claim) whose dispatcher client ids'
    /// tags do not verify: another receipt secret, or forgeries.
    foreign: u32,
}

impl Owners {
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let client: BaseConsumer = crate::kafka::admin_config(config)
            .set("client.id", "dispatcher-forwarder")
            .create()
            .context("creating the group-describe client")?;
        Ok(Owners {
            client: Arc::new(client),
            views: Mutex::new(HashMap::new()),
            signer: AddressSigner::new(&config.receipt_secret),
            queues: config
                .queues
                .iter()
                .map(|q| (q.group.clone(), q.name.clone()))
                .collect(),
            warned: Arc::default(),
        })
    }

    /// The advertised internal address of the member of `group` that owns
    /// `topic`/`partition`, other than `not`.
    pub async fn owner(
        &self,
        group: &str,
        topic: &str,
        partition: i32,
        not: &str,
    ) -> Option<String> {
        let key = (topic.to_string(), partition);
        let cached = self.views.lock().unwrap().get(group).cloned();
        if let Some(view) = &cached {
            let fresh = view.fetched.elapsed() < OWNERS_TTL;
            match view.owners.get(&key) {
                Some(addr) if fresh && addr != not => return Some(addr.clone()),
                _ if view.fetched.elapsed() < OWNERS_MIN_REFRESH => return None,
                _ => {}
            }
        }
        let view = self.fetch(group).await?;
        let found = view.owners.get(&key).filter(|a| *a != not).cloned();
        self.views.lock().unwrap().insert(group.to_string(), view);
        found
    }

    /// The advertised internal addresses of every dispatcher instance in
    /// `group` now (a fresh DescribeGroups); `None` when it cannot be
    /// described.
    pub async fn members(&self, group: &str) -> Option<Vec<String>> {
        let view = self.fetch(group).await?;
        let members = view.members.to_vec();
        self.views.lock().unwrap().insert(group.to_string(), view);
        Some(members)
    }

    /// Members of `group` that sign with another receipt secret, from a
    /// view at most [`OWNERS_TTL`] old (refreshed when older).
    pub async fn foreign_secret_members(&self, group: &str) -> Option<u32> {
        let cached = self.views.lock().unwrap().get(group).cloned();
        if let Some(view) = cached.filter(|v| v.fetched.elapsed() < OWNERS_TTL) {
            return Some(view.foreign);
        }
        let view = self.fetch(group).await?;
        let foreign = view.foreign;
        self.views.lock().unwrap().insert(group.to_string(), view);
        Some(foreign)
    }

    async fn fetch(&self, group: &str) -> Option<View> {
        let client = self.client.clone();
        let group_name = group.to_string();
        let signer = self.signer.clone();
        let warned = self.warned.clone();
        let queue = self.queues.get(group).cloned().unwrap_or_default();
        let listed = tokio::task::spawn_blocking(move || {
            let list = client.fetch_group_list(Some(&group_name), DESCRIBE_TIMEOUT)?;
            let mut owners = HashMap::new();
            let mut members = Vec::new();
            let mut unverified = 0usize;
            // By the address each claims: an instance has a member per
            // topic of the queue (the primary and each retry tier).
            let mut foreign = std::collections::HashSet::new();
            for g in list.groups() {
                for member in g.members() {
                    let addr = match signer.verify(member.client_id()) {
                        Ok(addr) => addr,
                        Err(why) => {
                            unverified += 1;
                            if why == Unverified::BadTag {
                                foreign.insert(claimed_address(member.client_id()).to_string());
                            }
                            note_unverified(&warned, &queue, g.name(), member, why);
                            continue;
                        }
                    };
                    if !members.iter().any(|m| m == addr) {
                        members.push(addr.to_string());
                    }
                    let Some(bytes) = member.assignment() else {
                        continue;
                    };
                    match parse_assignment(bytes) {
                        Ok(tps) => {
                            for tp in tps {
                                owners.insert(tp, addr.to_string());
                            }
                        }
                        Err(e) => tracing::warn!(
                            group = %g.name(),
                            member = %member.id(),
                            "unreadable assignment: {e:#}"
                        ),
                    }
                }
            }
            metrics::gauge!("dispatcher_group_unverified_members", "queue" => queue.clone())
                .set(unverified as f64);
            let foreign = u32::try_from(foreign.len()).unwrap_or(u32::MAX);
            metrics::gauge!("dispatcher_group_foreign_secret_members", "queue" => queue)
                .set(f64::from(foreign));
            Ok::<_, rdkafka::error::KafkaError>((owners, members, foreign))
        })
        .await
        .expect("describing a group does not panic");
        match listed {
            Ok((owners, members, foreign)) => Some(View {
                fetched: Instant::now(),
                owners: Arc::new(owners),
                members: Arc::new(members),
                foreign,
            }),
            Err(e) => {
                tracing::warn!(%group, "describing the group to find a partition's owner: {e}");
                None
            }
        }
    }
}

/// Logs a group member whose client id names no verified address, once per
/// member (it is never forwarded to).
fn note_unverified(
    warned: &Mutex<std::collections::HashSet<(String, String)>>,
    queue: &str,
    group: &str,
    member: &rdkafka::groups::GroupMemberInfo,
    why: Unverified,
) {
    let key = (group.to_string(), member.id().to_string());
    {
        let mut warned = warned.lock().unwrap();
        if warned.contains(&key) || warned.len() >= MAX_WARNED_MEMBERS {
            return;
        }
        warned.insert(key);
    }
    if why == Unverified::BadTag {
        tracing::error!(
            queue,
            group,
            member = member.id(),
            client_id = member.client_id(),
            host = member.client_host(),
            "a dispatcher instance in this queue's group signs with another receipt_secret (or \
             forges a dispatcher's client id): this instance cannot verify its receipts nor it \
             ours, so acks and nacks between the two are refused and their messages are \
             delivered again when their leases run out. Give every instance of the group the \
             same receipt_secret (dispatcher_group_foreign_secret_members, GET /queues/<queue>)"
        );
        return;
    }
    let why = match why {
        Unverified::NotDispatcher => "not a dispatcher's client id",
        Unverified::Unsigned => {
            "an address without a tag (a dispatcher older than signed addresses?)"
        }
        Unverified::BadTag => {
            "an address whose tag does not verify (another receipt secret, or forged)"
        }
    };
    tracing::warn!(
        queue,
        group,
        member = member.id(),
        client_id = member.client_id(),
        host = member.client_host(),
        "a member of the queue's group names no address to forward to ({why}): it is never \
         forwarded to, and partitions assigned to it are not served by any dispatcher"
    );
}

/// What the wrapper needs to place a receipt of one queue.
struct QueueRoute {
    group: String,
    /// By the topic index receipts carry: 0 the primary, n the n-th tier.
    topics: Vec<String>,
    codec: ReceiptCodec,
}

impl QueueRoute {
    fn new(config: &Config, queue: &QueueConfig) -> Self {
        let mut topics = vec![queue.topic.clone()];
        topics.extend(queue.retry_topics());
        QueueRoute {
            group: queue.group.clone(),
            topics,
            codec: ReceiptCodec::new(&config.receipt_secret.mac_key(), &queue.name),
        }
    }

    /// The topic and partition a valid receipt names (a replayed hold
    /// copy's, of an ordered queue, is served by the primary partition's
    /// owner).
    fn place(&self, receipt: &str) -> Option<(&str, i32)> {
        let r = self.codec.decode(receipt).ok()?;
        let index = if r.partition.topic == crate::queue::ordered::HOLD_TOPIC {
            0
        } else {
            usize::from(r.partition.topic)
        };
        let topic = self.topics.get(index)?;
        Some((topic, r.partition.partition))
    }
}

/// A [`QueueService`] that serves what the local one cannot by asking the
/// partition's owner.
pub struct Forwarding<S> {
    local: Arc<S>,
    routes: HashMap<String, QueueRoute>,
    owners: Owners,
    http: reqwest::Client,
    /// `https` when the internal listeners serve TLS (`[internal] tls`).
    scheme: &'static str,
    /// This instance's advertised address: never forwarded to.
    me: String,
}

impl<S: QueueService> Forwarding<S> {
    /// Looks at every queue's group now: a member signing with another
    /// receipt secret is logged and counted even while nothing is forwarded.
    pub async fn check_groups(&self) {
        for route in self.routes.values() {
            let _ = self.owners.members(&route.group).await;
        }
    }

    /// `me` is this instance's advertised internal address
    /// (`config.advertised_internal` once resolved).
    pub fn new(local: Arc<S>, config: &Config, me: String) -> anyhow::Result<Self> {
        let routes = config
            .queues
            .iter()
            .map(|q| (q.name.clone(), QueueRoute::new(config, q)))
            .collect();
        crate::security::tls::install_ring_provider();
        let mut builder = reqwest::Client::builder()
            .timeout(FORWARD_TIMEOUT)
            .no_proxy();
        if let Some(auth) = crate::security::InternalAuth::new(&config.internal) {
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(
                crate::security::INTERNAL_SECRET_HEADER,
                auth.header_value()?,
            );
            builder = builder.default_headers(headers);
        }
        let internal = &config.internal;
        if internal.tls {
            // The peers' certificate is [tls]'s; trusted from ca_file, else
            // from the system's roots.
            if let Some(ca) = &internal.ca_file {
                let identity = internal
                    .cert_file
                    .as_deref()
                    .zip(internal.key_file.as_deref());
                builder = builder.tls_backend_preconfigured(
                    crate::security::tls::client_config(ca, identity)
                        .context("the forwarding client's TLS ([internal] ca_file)")?,
                );
            }
        }
        let http = builder
            .build()
            .context("creating the forwarding HTTP client")?;
        Ok(Forwarding {
            local,
            routes,
            owners: Owners::new(config)?,
            http,
            scheme: if internal.tls { "https" } else { "http" },
            me,
        })
    }

    /// The owner's address for a receipt the local service does not own.
    async fn owner_of(&self, queue: &str, receipt: &str) -> Option<String> {
        let route = self.routes.get(queue)?;
        let (topic, partition) = route.place(receipt)?;
        self.owners
            .owner(&route.group, topic, partition, &self.me)
            .await
    }

    async fn post<T: Serialize, R: for<'de> Deserialize<'de>>(
        &self,
        owner: &str,
        queue: &str,
        op: &str,
        body: &T,
    ) -> anyhow::Result<R> {
        let url = format!(
            "{}://{owner}{INTERNAL_PREFIX}/queues/{queue}/{op}",
            self.scheme
        );
        let response = self
            .http
            .post(&url)
            .json(body)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status();
        anyhow::ensure!(status.is_success(), "POST {url}: HTTP {status}");
        response
            .json::<R>()
            .await
            .with_context(|| format!("POST {url}: reading the answer"))
    }
}

impl<S: QueueService> Forwarding<S> {
    /// Sends a redrive request to the owner of the queue's partition 0
    /// (where redrive jobs run) and reads its answer back into the service's
    /// types. `op` is "" (start or status), "pause", "resume" or "cancel".
    async fn forward_redrive(
        &self,
        queue: &str,
        op: &str,
        body: Option<&RedriveRequest>,
    ) -> Result<RedriveJob, RedriveError> {
        let unavailable = |m: String| RedriveError::Service(ServiceError::Unavailable(m));
        let Some(route) = self.routes.get(queue) else {
            return Err(RedriveError::Service(ServiceError::UnknownQueue(
                queue.to_owned(),
            )));
        };
        let Some(owner) = self
            .owners
            .owner(&route.group, &route.topics[0], 0, &self.me)
            .await
        else {
            return Err(unavailable(format!(
                "no dispatcher instance owns partition 0 of {:?} now (redrive jobs run there); \
                 retry in a moment",
                route.topics[0]
            )));
        };
        let mut url = format!(
            "{}://{owner}{INTERNAL_PREFIX}/queues/{queue}/redrive",
            self.scheme
        );
        if !op.is_empty() {
            url = format!("{url}/{op}");
        }
        let request = match body {
            Some(b) => self.http.post(&url).json(b),
            None if op.is_empty() => self.http.get(&url),
            None => self.http.post(&url),
        };
        let response = request
            .send()
            .await
            .map_err(|e| unavailable(format!("forwarding to {owner}: {e}")))?;
        let status = response.status();
        if status.is_success() {
            return response
                .json::<RedriveJob>()
                .await
                .map_err(|e| unavailable(format!("reading {owner}'s answer: {e}")));
        }
        #[derive(Deserialize)]
        struct ErrorAnswer {
            error: ErrorAnswerDetail,
        }
        #[derive(Deserialize)]
        struct ErrorAnswerDetail {
            code: String,
            message: String,
        }
        let e = response
            .json::<ErrorAnswer>()
            .await
            .map_err(|e| unavailable(format!("{owner} answered HTTP {status}: {e}")))?
            .error;
        Err(match e.code.as_str() {
            "conflict" => RedriveError::Conflict(e.message),
            "no_redrive_job" => RedriveError::NoJob(e.message),
            "unknown_queue" => RedriveError::Service(ServiceError::UnknownQueue(queue.to_owned())),
            "invalid_argument" => RedriveError::Service(ServiceError::InvalidArgument(e.message)),
            _ => unavailable(format!("{owner}: {}", e.message)),
        })
    }
}

// The owner's JSON (the public HTTP API's shapes, see openapi.yaml).
#[derive(Serialize)]
struct AckBody<'a> {
    receipts: &'a [String],
}
#[derive(Deserialize)]
struct AckAnswer {
    results: Vec<StatusAnswer>,
}
#[derive(Deserialize)]
struct StatusAnswer {
    status: String,
}
#[derive(Serialize)]
struct NackBody<'a> {
    receipt: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    permanent: bool,
}
#[derive(Serialize)]
struct ExtendBody<'a> {
    receipt: &'a str,
    lease_seconds: u64,
}
#[derive(Deserialize)]
struct ExtendAnswer {
    status: String,
    #[serde(default)]
    lease_expires_at: Option<String>,
}

/// The API takes whole seconds; a fraction rounds up (never a shorter wait).
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn outcome(status: &str) -> ReceiptOutcome {
    match status {
        "ok" => ReceiptOutcome::Ok,
        "stale" => ReceiptOutcome::Stale,
        "invalid" => ReceiptOutcome::Invalid,
        _ => ReceiptOutcome::NotOwner,
    }
}

impl<S: QueueService> QueueService for Forwarding<S> {
    fn queues(&self) -> Vec<QueueConfig> {
        self.local.queues()
    }

    async fn produce(
        &self,
        queue: &str,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<ProduceResult>, ServiceError> {
        self.local.produce(queue, messages).await
    }

    async fn receive(
        &self,
        queue: &str,
        request: ReceiveRequest,
    ) -> Result<Vec<Delivery>, ServiceError> {
        self.local.receive(queue, request).await
    }

    async fn ack(
        &self,
        queue: &str,
        receipts: &[String],
    ) -> Result<Vec<ReceiptOutcome>, ServiceError> {
        let mut outcomes = self.local.ack(queue, receipts).await?;
        let mut by_owner: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, o) in outcomes.iter().enumerate() {
            if *o == ReceiptOutcome::NotOwner {
                if let Some(owner) = self.owner_of(queue, &receipts[i]).await {
                    by_owner.entry(owner).or_default().push(i);
                }
            }
        }
        for (owner, indexes) in by_owner {
            let batch: Vec<String> = indexes.iter().map(|&i| receipts[i].clone()).collect();
            let answer: anyhow::Result<AckAnswer> = self
                .post(&owner, queue, "ack", &AckBody { receipts: &batch })
                .await;
            match answer {
                Ok(a) if a.results.len() == indexes.len() => {
                    for (i, r) in indexes.into_iter().zip(a.results) {
                        outcomes[i] = outcome(&r.status);
                    }
                }
                Ok(_) => tracing::warn!(%owner, "forwarded ack: answer of the wrong length"),
                Err(e) => tracing::warn!(%owner, "forwarding an ack: {e:#}"),
            }
        }
        Ok(outcomes)
    }

    async fn nack(
        &self,
        queue: &str,
        request: NackRequest,
    ) -> Result<ReceiptOutcome, ServiceError> {
        let local = self.local.nack(queue, request.clone()).await?;
        if local != ReceiptOutcome::NotOwner {
            return Ok(local);
        }
        let Some(owner) = self.owner_of(queue, &request.receipt).await else {
            return Ok(local);
        };
        let body = NackBody {
            receipt: &request.receipt,
            retry_after_seconds: request.retry_after.map(ceil_secs),
            error: request.error.as_deref(),
            permanent: request.permanent,
        };
        match self
            .post::<_, StatusAnswer>(&owner, queue, "nack", &body)
            .await
        {
            Ok(a) => Ok(outcome(&a.status)),
            Err(e) => {
                tracing::warn!(%owner, "forwarding a nack: {e:#}");
                Ok(local)
            }
        }
    }

    async fn extend(
        &self,
        queue: &str,
        receipt: String,
        lease: Duration,
    ) -> Result<ExtendResult, ServiceError> {
        let local = self.local.extend(queue, receipt.clone(), lease).await?;
        if local.outcome != ReceiptOutcome::NotOwner {
            return Ok(local);
        }
        let Some(owner) = self.owner_of(queue, &receipt).await else {
            return Ok(local);
        };
        let body = ExtendBody {
            receipt: &receipt,
            lease_seconds: ceil_secs(lease).max(1),
        };
        match self
            .post::<_, ExtendAnswer>(&owner, queue, "extend", &body)
            .await
        {
            Ok(a) => Ok(ExtendResult {
                outcome: outcome(&a.status),
                lease_expires_at_ms: a
                    .lease_expires_at
                    .as_deref()
                    .and_then(crate::api::json::parse_rfc3339_ms),
            }),
            Err(e) => {
                tracing::warn!(%owner, "forwarding an extend: {e:#}");
                Ok(local)
            }
        }
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, ServiceError> {
        let mut stats = self.local.stats(queue).await?;
        if let Some(route) = self.routes.get(queue) {
            stats.foreign_secret_members = self
                .owners
                .foreign_secret_members(&route.group)
                .await
                .unwrap_or(0);
        }
        Ok(stats)
    }

    async fn record_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.local.record_paused(queue, paused).await
    }

    /// Recorded in the control topic first (so it outlives restarts and
    /// reaches instances that join later; nothing is applied when that
    /// fails), then applied here, then on every other instance in the
    /// queue's group now (their `/internal` route). An instance that could
    /// not be told is named in an `Unavailable` error; the change stands
    /// where it was made, the instance takes it up when it reads the
    /// control topic, and a retry (idempotent) confirms it.
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), ServiceError> {
        self.local.record_paused(queue, paused).await?;
        self.local.set_paused(queue, paused).await?;
        let Some(route) = self.routes.get(queue) else {
            return Ok(());
        };
        let action = if paused { "pause" } else { "resume" };
        let Some(members) = self.owners.members(&route.group).await else {
            return Err(ServiceError::Unavailable(format!(
                "{action}d on this instance only: the group {:?} could not be described to \
                 reach the others; retry",
                route.group
            )));
        };
        let mut failed = Vec::new();
        for addr in members.iter().filter(|a| **a != self.me) {
            let url = format!(
                "{}://{addr}{INTERNAL_PREFIX}/queues/{queue}/{action}",
                self.scheme
            );
            match self.http.post(&url).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => failed.push(format!("{addr} (HTTP {})", r.status())),
                Err(e) => failed.push(format!("{addr} ({e})")),
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        tracing::warn!(queue, action, ?failed, "instances not reached");
        Err(ServiceError::Unavailable(format!(
            "{action}d here, but not on {}; retry",
            failed.join(", ")
        )))
    }

    /// Not merged: each instance lists the parked keys of the partitions it
    /// owns (see `docs/dispatcher.md`).
    async fn parked(&self, queue: &str) -> Result<Vec<ParkedKeyInfo>, ServiceError> {
        self.local.parked(queue).await
    }

    /// Sent to the owner of the partition, as acks are.
    async fn skip(&self, queue: &str, request: SkipRequest) -> Result<SkipOutcome, ServiceError> {
        let local = self.local.skip(queue, request.clone()).await?;
        if local != SkipOutcome::NotOwner {
            return Ok(local);
        }
        let Some(route) = self.routes.get(queue) else {
            return Ok(local);
        };
        let Some(owner) = self
            .owners
            .owner(&route.group, &route.topics[0], request.partition, &self.me)
            .await
        else {
            return Ok(local);
        };
        let url = format!(
            "{}://{owner}{INTERNAL_PREFIX}/queues/{queue}/skip",
            self.scheme
        );
        let body = SkipBody {
            partition: request.partition,
            key_base64: base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                &request.key,
            ),
            message_id: &request.message_id,
        };
        let answer = match self.http.post(&url).json(&body).send().await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::warn!(%owner, "forwarding a skip: {e:#}");
                return Ok(local);
            }
        };
        let status = answer.status();
        if status.is_success() {
            return Ok(SkipOutcome::Released);
        }
        let code = answer
            .json::<ErrorAnswer>()
            .await
            .map(|e| e.error.code)
            .unwrap_or_default();
        Ok(match code.as_str() {
            "not_parked" => SkipOutcome::NotParked,
            "other_message" => SkipOutcome::OtherMessage,
            "already_released" => SkipOutcome::AlreadyReleased,
            _ => {
                tracing::warn!(%owner, %status, code, "forwarding a skip");
                local
            }
        })
    }

    /// The local trace; where the message's latest record is in a partition
    /// another instance owns, that owner's trace (its lease engine knows
    /// whether the message is in flight, waiting or acked above the commit
    /// point). When the owner is not found or does not answer, the local
    /// trace stands (its state then rests on the group's commit).
    async fn trace(
        &self,
        message_id: &str,
        queue: Option<&str>,
    ) -> Result<Vec<MessageTrace>, ServiceError> {
        let mut traces = self.local.trace(message_id, queue).await?;
        for t in &mut traces {
            if t.state.status != Status::NotAcked || t.state.source != Source::Commit {
                continue;
            }
            let Some(route) = self.routes.get(&t.queue) else {
                continue;
            };
            let place = &t.state.location;
            let Some(owner) = self
                .owners
                .owner(&route.group, &place.topic, place.partition, &self.me)
                .await
            else {
                continue;
            };
            match self.owner_trace(&owner, message_id, &t.queue).await {
                Ok(answer) => {
                    if let Some(theirs) = answer.traces.into_iter().find(|a| a.queue == t.queue) {
                        *t = theirs;
                    }
                }
                Err(e) => tracing::warn!(%owner, "asking the owner for a trace: {e:#}"),
            }
        }
        Ok(traces)
    }

    async fn redrive_start(
        &self,
        queue: &str,
        request: RedriveRequest,
    ) -> Result<RedriveJob, RedriveError> {
        match self.local.redrive_start(queue, request.clone()).await {
            Err(RedriveError::NotOwner) => self.forward_redrive(queue, "", Some(&request)).await,
            other => other,
        }
    }

    async fn redrive_status(&self, queue: &str) -> Result<RedriveJob, RedriveError> {
        match self.local.redrive_status(queue).await {
            Err(RedriveError::NotOwner) => self.forward_redrive(queue, "", None).await,
            other => other,
        }
    }

    async fn redrive_control(
        &self,
        queue: &str,
        action: RedriveAction,
    ) -> Result<RedriveJob, RedriveError> {
        match self.local.redrive_control(queue, action).await {
            Err(RedriveError::NotOwner) => self.forward_redrive(queue, action.name(), None).await,
            other => other,
        }
    }
}

impl<S: QueueService> Forwarding<S> {
    async fn owner_trace(
        &self,
        owner: &str,
        message_id: &str,
        queue: &str,
    ) -> anyhow::Result<TraceResponse> {
        let mut url = reqwest::Url::parse(&format!(
            "{}://{owner}{INTERNAL_PREFIX}/messages/",
            self.scheme
        ))
        .with_context(|| format!("the owner's address {owner:?}"))?;
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("http://{owner} takes no path"))?
            .pop_if_empty()
            .push(message_id);
        url.query_pairs_mut().append_pair("queue", queue);
        let response = self
            .http
            .get(url.clone())
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        anyhow::ensure!(status.is_success(), "GET {url}: HTTP {status}");
        response
            .json::<TraceResponse>()
            .await
            .with_context(|| format!("GET {url}: reading the answer"))
    }
}

#[derive(Serialize)]
struct SkipBody<'a> {
    partition: i32,
    key_base64: String,
    message_id: &'a str,
}
#[derive(Deserialize)]
struct ErrorAnswer {
    error: ErrorCode,
}
#[derive(Deserialize)]
struct ErrorCode {
    code: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable as _, StrBytes};

    fn encoded(version: i16, assignment: &ConsumerProtocolAssignment) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        buf.extend_from_slice(&version.to_be_bytes());
        assignment.encode(&mut buf, version).unwrap();
        buf.to_vec()
    }

    #[test]
    fn assignments_of_every_version_are_read() {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
            TopicPartition::default()
                .with_topic(TopicName(StrBytes::from_static_str("jobs")))
                .with_partitions(vec![0, 2]),
            TopicPartition::default()
                .with_topic(TopicName(StrBytes::from_static_str("jobs.retry.10s")))
                .with_partitions(vec![1]),
        ]);
        for version in 0..=3 {
            assert_eq!(
                parse_assignment(&encoded(version, &a)).unwrap(),
                vec![
                    ("jobs".to_string(), 0),
                    ("jobs".to_string(), 2),
                    ("jobs.retry.10s".to_string(), 1)
                ],
                "version {version}"
            );
        }
        assert_eq!(parse_assignment(&[]).unwrap(), vec![]);
        assert!(parse_assignment(&[0, 0, 0, 0, 0, 9]).is_err());
        assert!(parse_assignment(&[0]).is_err());
    }

    /// Counts and lengths promising more than the bytes hold are refused
    /// before the decoder allocates for them (a 2^31-1 topic count made it
    /// reserve 32 GiB and abort the process; found by the `values` fuzz
    /// target).
    #[test]
    fn an_assignment_declaring_more_than_it_holds_is_refused() {
        let max = i32::MAX.to_be_bytes();
        let mut topics = vec![0, 0];
        topics.extend(max);
        let mut partitions = vec![0, 0, 0, 0, 0, 1, 0, 1, b'a'];
        partitions.extend(max);
        let mut user_data = vec![0, 0, 0, 0, 0, 0];
        user_data.extend(max);
        let mut name = vec![0, 0, 0, 0, 0, 1, 0x7f, 0xff];
        name.extend([0; 4]);
        for bytes in [topics, partitions, user_data, name] {
            let err = parse_assignment(&bytes).expect_err("refused");
            assert!(err.to_string().contains("assignment"), "{err:#}");
        }
        // Null user data and an empty topic list are fine.
        assert_eq!(
            parse_assignment(&[0, 1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).unwrap(),
            vec![]
        );
    }

    fn signer(secret: &str) -> AddressSigner {
        AddressSigner::new(&crate::config::ReceiptSecret {
            key: secret.as_bytes().to_vec(),
            origin: crate::config::SecretOrigin::Inline,
        })
    }

    #[test]
    fn only_signed_dispatcher_client_ids_name_an_owner() {
        let s = signer("dispatcher-test-secret-0123456789");
        let id = s.client_id("jobs", "10.0.0.7:8082");
        assert!(id.starts_with("dispatcher-jobs@10.0.0.7:8082#"), "{id}");
        assert_eq!(id.len(), "dispatcher-jobs@10.0.0.7:8082#".len() + 32);
        assert_eq!(s.verify(&id), Ok("10.0.0.7:8082"));

        // Another address, queue or secret under the same tag: refused.
        let tag = id.rsplit_once('#').unwrap().1;
        for forged in [
            format!("dispatcher-jobs@evil.example:80#{tag}"),
            format!("dispatcher-other@10.0.0.7:8082#{tag}"),
        ] {
            assert_eq!(s.verify(&forged), Err(Unverified::BadTag), "{forged}");
        }
        assert_eq!(
            signer("another-secret-0123456789").verify(&id),
            Err(Unverified::BadTag)
        );
        let mut flipped = id.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(
            s.verify(std::str::from_utf8(&flipped).unwrap()),
            Err(Unverified::BadTag)
        );
        for bad_tag in ["", "zz", "00", &"g".repeat(32), &"0".repeat(31)] {
            assert_eq!(
                s.verify(&format!("dispatcher-jobs@10.0.0.7:8082#{bad_tag}")),
                Err(Unverified::BadTag),
                "{bad_tag:?}"
            );
        }
        assert_eq!(
            s.verify("dispatcher-jobs@10.0.0.7:8082"),
            Err(Unverified::Unsigned)
        );
        for other in [
            "dispatcher-jobs",
            "rdkafka@h:1#00",
            "dispatcher-jobs@",
            "",
            "jobs@h:1",
        ] {
            assert_eq!(s.verify(other), Err(Unverified::NotDispatcher), "{other:?}");
        }
    }

    #[test]
    fn statuses_map_back_to_outcomes() {
        assert_eq!(outcome("ok"), ReceiptOutcome::Ok);
        assert_eq!(outcome("stale"), ReceiptOutcome::Stale);
        assert_eq!(outcome("invalid"), ReceiptOutcome::Invalid);
        assert_eq!(outcome("not_owner"), ReceiptOutcome::NotOwner);
        assert_eq!(outcome("something new"), ReceiptOutcome::NotOwner);
    }
}
