//! Client quotas: which quota applies to a (user, client id), the rate
//! each quota's clients are measured at, and how long a client over its
//! quota must wait. Kafka's `ClientQuotaManager` and its subclasses.
//!
//! The quotas live in the metadata image (`MetadataImage::client_quotas`);
//! what applies to one (principal, client id) is resolved once and cached
//! until the image's quotas change. Each quota has one rate per set of
//! clients it covers: a quota on `/users/alice` is shared by all of alice's
//! clients; `/users/<default>` gives every user one of their own.
//!
//! Invariant: nothing here touches a socket or reads the clock; the
//! connection passes `now_ms` and mutes itself for the time returned.

pub mod connections;
pub mod rate;
pub mod usage;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kafka_protocol::messages::ResponseKind;

use crate::metadata::{ClientQuotaEntity, MetadataImage, QuotaEntityName, QuotaValue};
use rate::{RateConfig, SampledRate};

pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// The quota keys a user, client-id or (user, client-id) entity may set,
/// and whether each must be a whole number (Kafka's `QuotaConfigs`).
pub const CLIENT_QUOTA_KEYS: &[(&str, bool)] = &[
    (PRODUCER_BYTE_RATE, true),
    (CONSUMER_BYTE_RATE, true),
    (REQUEST_PERCENTAGE, false),
    (CONTROLLER_MUTATION_RATE, false),
];

/// The quota key an IP entity may set.
pub const IP_QUOTA_KEYS: &[(&str, bool)] = &[(CONNECTION_CREATION_RATE, true)];

/// What a client quota limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuotaType {
    /// Produce request bytes per second.
    Produce,
    /// Fetch response bytes per second.
    Fetch,
    /// Percentage of one request thread's time.
    Request,
    /// Partitions created or deleted per second.
    ControllerMutation,
}

impl QuotaType {
    pub const ALL: [QuotaType; 4] = [
        QuotaType::Produce,
        QuotaType::Fetch,
        QuotaType::Request,
        QuotaType::ControllerMutation,
    ];

    pub fn key(self) -> &'static str {
        match self {
            QuotaType::Produce => PRODUCER_BYTE_RATE,
            QuotaType::Fetch => CONSUMER_BYTE_RATE,
            QuotaType::Request => REQUEST_PERCENTAGE,
            QuotaType::ControllerMutation => CONTROLLER_MUTATION_RATE,
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            QuotaType::Produce => "produce",
            QuotaType::Fetch => "fetch",
            QuotaType::Request => "request",
            QuotaType::ControllerMutation => "controller_mutation",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The clients one quota's rate covers, as Kafka's quota metric tags: the
/// user's and client id's names where the matched entity has that part
/// (a default part stands for each name separately), empty where not.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SensorKey {
    pub user: String,
    pub client_id: String,
}

/// The quota that applies to one client for one quota type.
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedQuota {
    pub sensor: SensorKey,
    pub limit: f64,
}

type Quotas = BTreeMap<ClientQuotaEntity, BTreeMap<String, QuotaValue>>;

/// The most specific quota for `key` that applies to `user` and
/// `client_id`, in Kafka's order of precedence: /users/u/clients/c,
/// /users/u/clients/<default>, /users/u, /users/<default>/clients/c,
/// /users/<default>/clients/<default>, /users/<default>, /clients/c,
/// /clients/<default>.
pub fn resolve(quotas: &Quotas, user: &str, client_id: &str, key: &str) -> Option<AppliedQuota> {
    use QuotaEntityName::{Default, Named};
    let u = || Some(Named(user.to_string()));
    let c = || Some(Named(client_id.to_string()));
    let order: [(Option<QuotaEntityName>, Option<QuotaEntityName>); 8] = [
        (u(), c()),
        (u(), Some(Default)),
        (u(), None),
        (Some(Default), c()),
        (Some(Default), Some(Default)),
        (Some(Default), None),
        (None, c()),
        (None, Some(Default)),
    ];
    for (user_part, client_part) in order {
        let entity = ClientQuotaEntity {
            user: user_part,
            client_id: client_part,
            ip: None,
        };
        if let Some(v) = quotas.get(&entity).and_then(|values| values.get(key)) {
            return Some(AppliedQuota {
                sensor: SensorKey {
                    user: if entity.user.is_some() {
                        user.to_string()
                    } else {
                        String::new()
                    },
                    client_id: if entity.client_id.is_some() {
                        client_id.to_string()
                    } else {
                        String::new()
                    },
                },
                limit: v.0,
            });
        }
    }
    None
}

/// A principal's user name for quotas: `User:alice` is `alice`.
pub fn user_of(principal: &str) -> &str {
    principal.strip_prefix("User:").unwrap_or(principal)
}

/// The quotas resolved for one (principal, client id), one per type.
type Resolved = [Option<AppliedQuota>; 4];

/// Resolved quotas kept at most for this many (principal, client id)
/// pairs; past it the cache starts over.
const RESOLVED_CACHE_MAX: usize = 100_000;

/// Sensors kept before idle ones are dropped.
const SENSORS_SWEEP_AT: usize = 100_000;

/// How a client over a quota is held back, and what it was measured at.
pub struct QuotaManager {
    rate: RateConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The quotas the cache was resolved against.
    quotas: Option<Arc<MetadataImage>>,
    resolved: HashMap<(Arc<str>, Arc<str>), Arc<Resolved>>,
    sensors: HashMap<(QuotaType, SensorKey), SampledRate>,
}

impl QuotaManager {
    pub fn new(rate: RateConfig) -> Self {
        Self {
            rate,
            state: Mutex::new(State::default()),
        }
    }

    pub fn rate_config(&self) -> RateConfig {
        self.rate
    }

    /// The quotas for a client, resolved against `image` (cached until the
    /// image's quotas change).
    fn resolved(
        state: &mut State,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
    ) -> Arc<Resolved> {
        let current = match &state.quotas {
            Some(seen) => Arc::ptr_eq(seen, image) || seen.client_quotas == image.client_quotas,
            None => false,
        };
        if !current {
            state.resolved.clear();
        }
        state.quotas = Some(image.clone());
        if let Some(r) = state.resolved.get(&(principal.clone(), client_id.clone())) {
            return r.clone();
        }
        let user = user_of(principal);
        let r: Arc<Resolved> = Arc::new(
            QuotaType::ALL.map(|t| resolve(&image.client_quotas, user, client_id, t.key())),
        );
        if state.resolved.len() >= RESOLVED_CACHE_MAX {
            state.resolved.clear();
        }
        state
            .resolved
            .insert((principal.clone(), client_id.clone()), r.clone());
        r
    }

    /// The quota of `kind` that applies to the client, if any.
    pub fn quota(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
    ) -> Option<AppliedQuota> {
        if image.client_quotas.is_empty() {
            return None;
        }
        let mut state = self.state.lock().expect("quota state poisoned");
        Self::resolved(&mut state, image, principal, client_id)[kind.index()].clone()
    }

    /// Records `value` against the client's quota of `kind` and returns the
    /// throttle time in milliseconds (0 within the quota, or with no quota).
    pub fn record(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
        value: f64,
        now_ms: u64,
    ) -> u64 {
        let rate = self.rate;
        self.with_sensor(
            image,
            principal,
            client_id,
            kind,
            now_ms,
            |sensor, limit| sensor.record_and_throttle_ms(rate, value, limit, now_ms),
        )
    }

    /// Kafka's strict quota check: when the client's rate of `kind` is
    /// already over its quota, returns the throttle time and records
    /// nothing; otherwise records `value`, however far over it goes, and
    /// returns 0 (`StrictControllerMutationQuota.record`).
    pub fn check_then_record(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
        value: f64,
        now_ms: u64,
    ) -> u64 {
        let rate = self.rate;
        self.with_sensor(
            image,
            principal,
            client_id,
            kind,
            now_ms,
            |sensor, limit| {
                let throttle_ms = sensor.throttle_ms(rate, limit, now_ms);
                if throttle_ms == 0 {
                    sensor.record(rate, value, now_ms);
                }
                throttle_ms
            },
        )
    }

    /// Runs `measure` on the client's sensor for `kind` (made on first use)
    /// with its quota's limit, and counts a throttle it returns. 0 without
    /// quotas (Kafka's "no quotas" fast path: nothing measured at all) or
    /// without a quota of `kind` for this client.
    fn with_sensor(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
        now_ms: u64,
        measure: impl FnOnce(&mut SampledRate, f64) -> u64,
    ) -> u64 {
        if image.client_quotas.is_empty() {
            return 0;
        }
        let mut state = self.state.lock().expect("quota state poisoned");
        let Some(applied) =
            Self::resolved(&mut state, image, principal, client_id)[kind.index()].clone()
        else {
            return 0;
        };
        if state.sensors.len() >= SENSORS_SWEEP_AT {
            let idle_ms = self.rate.samples as u64 * self.rate.window_ms;
            state
                .sensors
                .retain(|_, r| now_ms.saturating_sub(r.last_sample_ms()) < idle_ms);
        }
        let sensor = state
            .sensors
            .entry((kind, applied.sensor))
            .or_insert_with(|| SampledRate::new(now_ms));
        let throttle_ms = measure(sensor, applied.limit);
        drop(state);
        if throttle_ms > 0 {
            metrics::counter!("kafka_broker_quota_throttled_requests_total", "quota" => kind.label())
                .increment(1);
            metrics::histogram!("kafka_broker_quota_throttle_time_seconds", "quota" => kind.label())
                .record(throttle_ms as f64 / 1000.0);
        }
        throttle_ms
    }

    /// The most of `kind` the client could use at once without being
    /// throttled, having used nothing in the window: its quota times
    /// `samples - 1` windows (Kafka's `getMaxValueInQuotaWindow`). `None`
    /// with no quota.
    pub fn max_in_window(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
    ) -> Option<f64> {
        let applied = self.quota(image, principal, client_id, kind)?;
        let windows = self.rate.samples.saturating_sub(1) as f64;
        Some(applied.limit * windows * self.rate.window_ms as f64 / 1000.0)
    }

    /// Takes back a value recorded for a response that was not sent (a
    /// throttled consumer's Fetch, whose records are left out), as Kafka's
    /// `unrecordQuotaSensor`.
    pub fn unrecord(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
        value: f64,
        now_ms: u64,
    ) {
        if image.client_quotas.is_empty() {
            return;
        }
        let mut state = self.state.lock().expect("quota state poisoned");
        let Some(applied) =
            Self::resolved(&mut state, image, principal, client_id)[kind.index()].clone()
        else {
            return;
        };
        if let Some(sensor) = state.sensors.get_mut(&(kind, applied.sensor)) {
            sensor.record(self.rate, -value, now_ms);
        }
    }

    /// The client's observed rate of `kind` (units per second), for tests
    /// and diagnostics.
    pub fn observed_rate(
        &self,
        image: &Arc<MetadataImage>,
        principal: &Arc<str>,
        client_id: &Arc<str>,
        kind: QuotaType,
        now_ms: u64,
    ) -> Option<f64> {
        let applied = self.quota(image, principal, client_id, kind)?;
        let mut state = self.state.lock().expect("quota state poisoned");
        let rate = self.rate;
        state
            .sensors
            .get_mut(&(kind, applied.sensor))
            .map(|s| s.rate(rate, now_ms))
    }
}

/// Sets a response's `throttle_time_ms`, where the response has one.
/// Returns whether it did.
pub fn set_throttle_time(response: &mut ResponseKind, throttle_ms: i32) -> bool {
    macro_rules! set {
        ($r:expr) => {{
            $r.throttle_time_ms = throttle_ms;
            true
        }};
    }
    use ResponseKind as S;
    match response {
        S::Produce(r) => set!(r),
        S::Fetch(r) => set!(r),
        S::ListOffsets(r) => set!(r),
        S::Metadata(r) => set!(r),
        S::OffsetCommit(r) => set!(r),
        S::OffsetFetch(r) => set!(r),
        S::FindCoordinator(r) => set!(r),
        S::JoinGroup(r) => set!(r),
        S::Heartbeat(r) => set!(r),
        S::LeaveGroup(r) => set!(r),
        S::SyncGroup(r) => set!(r),
        S::DescribeGroups(r) => set!(r),
        S::ListGroups(r) => set!(r),
        S::ApiVersions(r) => set!(r),
        S::CreateTopics(r) => set!(r),
        S::DeleteTopics(r) => set!(r),
        S::DeleteRecords(r) => set!(r),
        S::InitProducerId(r) => set!(r),
        S::OffsetForLeaderEpoch(r) => set!(r),
        S::AddPartitionsToTxn(r) => set!(r),
        S::AddOffsetsToTxn(r) => set!(r),
        S::EndTxn(r) => set!(r),
        S::TxnOffsetCommit(r) => set!(r),
        S::DescribeConfigs(r) => set!(r),
        S::AlterConfigs(r) => set!(r),
        S::CreatePartitions(r) => set!(r),
        S::DeleteGroups(r) => set!(r),
        S::IncrementalAlterConfigs(r) => set!(r),
        S::OffsetDelete(r) => set!(r),
        S::DescribeClientQuotas(r) => set!(r),
        S::AlterClientQuotas(r) => set!(r),
        S::DescribeUserScramCredentials(r) => set!(r),
        S::AlterUserScramCredentials(r) => set!(r),
        S::DescribeCluster(r) => set!(r),
        S::DescribeProducers(r) => set!(r),
        S::ElectLeaders(r) => set!(r),
        S::DescribeLogDirs(r) => set!(r),
        S::DescribeTransactions(r) => set!(r),
        S::ListTransactions(r) => set!(r),
        S::ConsumerGroupHeartbeat(r) => set!(r),
        S::ConsumerGroupDescribe(r) => set!(r),
        _ => false,
    }
}

/// Whether a client of this request version waits out its throttle itself
/// (KIP-219): then the response goes out at once and the broker mutes the
/// connection after it; before, the broker held the response back for the
/// throttle time. Kafka's `shouldClientThrottle` per API.
pub fn client_throttles(api_key: kafka_protocol::messages::ApiKey, version: i16) -> bool {
    use kafka_protocol::messages::ApiKey as K;
    let from = match api_key {
        K::Produce => 6,
        K::Fetch => 8,
        K::ListOffsets => 3,
        K::Metadata => 6,
        K::OffsetCommit => 4,
        K::OffsetFetch => 4,
        K::FindCoordinator => 2,
        K::JoinGroup => 3,
        K::Heartbeat => 2,
        K::LeaveGroup => 2,
        K::SyncGroup => 2,
        K::DescribeGroups => 2,
        K::ListGroups => 2,
        K::ApiVersions => 2,
        K::CreateTopics => 3,
        K::DeleteTopics => 2,
        K::DeleteRecords => 1,
        K::InitProducerId => 1,
        K::OffsetForLeaderEpoch => 2,
        K::AddPartitionsToTxn => 1,
        K::AddOffsetsToTxn => 1,
        K::EndTxn => 1,
        K::TxnOffsetCommit => 1,
        K::DescribeConfigs => 2,
        K::AlterConfigs => 1,
        K::CreatePartitions => 1,
        K::DeleteGroups => 1,
        K::IncrementalAlterConfigs => 1,
        _ => 0,
    };
    version >= from
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(user: Option<Option<&str>>, client: Option<Option<&str>>) -> ClientQuotaEntity {
        ClientQuotaEntity {
            user: user.map(QuotaEntityName::from_wire),
            client_id: client.map(QuotaEntityName::from_wire),
            ip: None,
        }
    }

    fn quotas(entries: &[(ClientQuotaEntity, f64)]) -> Quotas {
        entries
            .iter()
            .map(|(e, v)| {
                (
                    e.clone(),
                    BTreeMap::from([(PRODUCER_BYTE_RATE.to_string(), QuotaValue(*v))]),
                )
            })
            .collect()
    }

    #[test]
    fn the_most_specific_entity_wins_in_kafkas_order() {
        let levels = [
            (entity(Some(Some("alice")), Some(Some("app"))), 1.0),
            (entity(Some(Some("alice")), Some(None)), 2.0),
            (entity(Some(Some("alice")), None), 3.0),
            (entity(Some(None), Some(Some("app"))), 4.0),
            (entity(Some(None), Some(None)), 5.0),
            (entity(Some(None), None), 6.0),
            (entity(None, Some(Some("app"))), 7.0),
            (entity(None, Some(None)), 8.0),
        ];
        // Take the levels away from the most specific down: each time the
        // next one applies.
        for i in 0..levels.len() {
            let q = quotas(&levels[i..]);
            let applied = resolve(&q, "alice", "app", PRODUCER_BYTE_RATE).unwrap();
            assert_eq!(applied.limit, levels[i].1);
        }
        assert!(resolve(&Quotas::new(), "alice", "app", PRODUCER_BYTE_RATE).is_none());
    }

    #[test]
    fn a_user_quota_is_shared_by_the_users_clients_and_a_default_is_per_user() {
        let q = quotas(&[(entity(Some(Some("alice")), None), 1.0)]);
        let a = resolve(&q, "alice", "one", PRODUCER_BYTE_RATE).unwrap();
        let b = resolve(&q, "alice", "two", PRODUCER_BYTE_RATE).unwrap();
        assert_eq!(a.sensor, b.sensor);
        let q = quotas(&[(entity(Some(None), None), 1.0)]);
        let a = resolve(&q, "alice", "x", PRODUCER_BYTE_RATE).unwrap();
        let b = resolve(&q, "bob", "x", PRODUCER_BYTE_RATE).unwrap();
        assert_ne!(a.sensor, b.sensor);
        assert_eq!(a.sensor.client_id, "");
    }

    #[test]
    fn the_cache_follows_quota_changes() {
        let m = QuotaManager::new(RateConfig::default());
        let principal: Arc<str> = Arc::from("User:alice");
        let client: Arc<str> = Arc::from("app");
        let mut image = MetadataImage::default();
        let empty = Arc::new(image.clone());
        assert!(m
            .quota(&empty, &principal, &client, QuotaType::Produce)
            .is_none());
        image.client_quotas = quotas(&[(entity(Some(Some("alice")), None), 10.0)]);
        let one = Arc::new(image.clone());
        assert_eq!(
            m.quota(&one, &principal, &client, QuotaType::Produce)
                .unwrap()
                .limit,
            10.0
        );
        image.client_quotas = quotas(&[(entity(Some(Some("alice")), None), 20.0)]);
        let two = Arc::new(image);
        assert_eq!(
            m.quota(&two, &principal, &client, QuotaType::Produce)
                .unwrap()
                .limit,
            20.0
        );
        // Over the quota: a throttle; the fetch quota is not set.
        assert!(m.record(&two, &principal, &client, QuotaType::Produce, 1000.0, 0) > 0);
        assert_eq!(
            m.record(&two, &principal, &client, QuotaType::Fetch, 1000.0, 0),
            0
        );
    }
}
