//! Connection limits, as Kafka's `ConnectionQuotas`: connections at once
//! per IP (`max.connections.per.ip`, `max.connections.per.ip.overrides`),
//! and connections created per second broker-wide and per listener
//! (`max.connection.creation.rate`, `listener.name.<l>.max.connection.creation.rate`)
//! and per IP (the `connection_creation_rate` quota of an `ips` entity).
//! `max.connections` itself is the server's semaphore.
//!
//! Decides only: the acceptor delays or closes as told. Every call takes
//! `now_ms`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::rate::{RateConfig, SampledRate};
use super::CONNECTION_CREATION_RATE;
use crate::metadata::{ClientQuotaEntity, MetadataImage, QuotaEntityName};

/// The configured connection limits.
#[derive(Clone, Debug, Default)]
pub struct ConnectionLimits {
    /// `max.connections.per.ip`.
    pub max_per_ip: usize,
    /// `max.connections.per.ip.overrides`, host names resolved.
    pub per_ip_overrides: HashMap<IpAddr, usize>,
    /// `max.connection.creation.rate`, broker-wide (None: unbounded).
    pub broker_rate: Option<f64>,
    /// `listener.name.<l>.max.connection.creation.rate`.
    pub listener_rates: HashMap<String, f64>,
}

/// What to do with a new connection.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Serve it (after waiting `delay_ms` for the creation rate, if > 0).
    Accept { delay_ms: u64 },
    /// Over `max.connections.per.ip`: close at once.
    TooManyForIp { limit: usize },
    /// Over the IP's `connection_creation_rate`: close after `delay_ms`
    /// (Kafka holds the socket for the throttle time, then closes it).
    IpThrottled { delay_ms: u64 },
}

pub struct ConnectionQuotas {
    limits: ConnectionLimits,
    rate: RateConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    per_ip: HashMap<IpAddr, usize>,
    broker_rate: Option<SampledRate>,
    listener_rates: HashMap<String, SampledRate>,
    ip_rates: HashMap<IpAddr, SampledRate>,
}

/// A connection counted against its IP; the count goes down when dropped.
pub struct ConnectionSlot {
    quotas: Arc<ConnectionQuotas>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut state = self
            .quotas
            .state
            .lock()
            .expect("connection quotas poisoned");
        if let Some(n) = state.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                state.per_ip.remove(&self.ip);
            }
        }
    }
}

/// An IP's `connection_creation_rate`: /ips/<ip>, then /ips/<default>.
fn ip_quota(image: &MetadataImage, ip: IpAddr) -> Option<f64> {
    if image.client_quotas.is_empty() {
        return None;
    }
    let entity = |name| ClientQuotaEntity {
        user: None,
        client_id: None,
        ip: Some(name),
    };
    [
        entity(QuotaEntityName::Named(ip.to_string())),
        entity(QuotaEntityName::Default),
    ]
    .iter()
    .find_map(|e| {
        image
            .client_quotas
            .get(e)
            .and_then(|v| v.get(CONNECTION_CREATION_RATE))
            .map(|v| v.0)
    })
}

impl ConnectionQuotas {
    pub fn new(limits: ConnectionLimits, rate: RateConfig) -> Arc<Self> {
        Arc::new(Self {
            limits,
            rate,
            state: Mutex::new(State::default()),
        })
    }

    /// Counts a new connection from `ip` on `listener` and says what to do
    /// with it. `Accept` comes with the slot that holds the IP's count.
    pub fn admit(
        self: &Arc<Self>,
        listener: &str,
        ip: IpAddr,
        image: &MetadataImage,
        now_ms: u64,
    ) -> (Admission, Option<ConnectionSlot>) {
        let mut state = self.state.lock().expect("connection quotas poisoned");
        let limit = self
            .limits
            .per_ip_overrides
            .get(&ip)
            .copied()
            .unwrap_or(self.limits.max_per_ip);
        let count = state.per_ip.get(&ip).copied().unwrap_or(0);
        if count >= limit {
            return (Admission::TooManyForIp { limit }, None);
        }
        // The IP's rate first: a throttled IP's connection is not counted
        // against the listener's and broker's rates (Kafka records the IP
        // sensor and throws before counting the connection).
        if let Some(quota) = ip_quota(image, ip) {
            let rate = self.rate;
            if state.ip_rates.len() >= 100_000 {
                let idle_ms = rate.samples as u64 * rate.window_ms;
                state
                    .ip_rates
                    .retain(|_, r| now_ms.saturating_sub(r.last_sample_ms()) < idle_ms);
            }
            let sensor = state
                .ip_rates
                .entry(ip)
                .or_insert_with(|| SampledRate::new(now_ms));
            let delay_ms = sensor.record_and_throttle_ms(rate, 1.0, quota, now_ms);
            if delay_ms > 0 {
                return (Admission::IpThrottled { delay_ms }, None);
            }
        }
        let mut delay_ms = 0;
        if let Some(quota) = self.limits.listener_rates.get(listener).copied() {
            let rate = self.rate;
            let sensor = state
                .listener_rates
                .entry(listener.to_string())
                .or_insert_with(|| SampledRate::new(now_ms));
            delay_ms = delay_ms.max(sensor.record_and_throttle_ms(rate, 1.0, quota, now_ms));
        }
        if let Some(quota) = self.limits.broker_rate {
            let rate = self.rate;
            let sensor = state
                .broker_rate
                .get_or_insert_with(|| SampledRate::new(now_ms));
            delay_ms = delay_ms.max(sensor.record_and_throttle_ms(rate, 1.0, quota, now_ms));
        }
        *state.per_ip.entry(ip).or_insert(0) += 1;
        drop(state);
        (
            Admission::Accept { delay_ms },
            Some(ConnectionSlot {
                quotas: self.clone(),
                ip,
            }),
        )
    }

    /// Connections now counted from `ip`.
    pub fn count(&self, ip: IpAddr) -> usize {
        let state = self.state.lock().expect("connection quotas poisoned");
        state.per_ip.get(&ip).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metadata::QuotaValue;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn limits(max_per_ip: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_per_ip,
            ..Default::default()
        }
    }

    #[test]
    fn the_per_ip_count_refuses_the_extra_connection_and_frees_on_close() {
        let q = ConnectionQuotas::new(limits(2), RateConfig::default());
        let image = MetadataImage::default();
        let (a, s1) = q.admit("PLAINTEXT", LOCAL, &image, 0);
        assert_eq!(a, Admission::Accept { delay_ms: 0 });
        let (_, s2) = q.admit("PLAINTEXT", LOCAL, &image, 0);
        let (c, s3) = q.admit("PLAINTEXT", LOCAL, &image, 0);
        assert_eq!(c, Admission::TooManyForIp { limit: 2 });
        assert!(s3.is_none());
        drop(s1);
        assert_eq!(q.count(LOCAL), 1);
        let (d, _s4) = q.admit("PLAINTEXT", LOCAL, &image, 0);
        assert_eq!(d, Admission::Accept { delay_ms: 0 });
        drop(s2);
    }

    #[test]
    fn an_override_replaces_the_default_for_its_ip() {
        let mut l = limits(1);
        l.per_ip_overrides.insert(LOCAL, 3);
        let q = ConnectionQuotas::new(l, RateConfig::default());
        let image = MetadataImage::default();
        let slots: Vec<_> = (0..3)
            .map(|_| q.admit("L", LOCAL, &image, 0).1.unwrap())
            .collect();
        assert!(matches!(
            q.admit("L", LOCAL, &image, 0).0,
            Admission::TooManyForIp { limit: 3 }
        ));
        drop(slots);
    }

    #[test]
    fn the_creation_rate_delays_and_the_ip_rate_closes() {
        let mut l = limits(usize::MAX);
        l.broker_rate = Some(1.0);
        let q = ConnectionQuotas::new(l, RateConfig::default());
        let image = MetadataImage::default();
        let mut delays = Vec::new();
        let mut slots = Vec::new();
        for _ in 0..20 {
            let (a, s) = q.admit("L", LOCAL, &image, 0);
            slots.push(s);
            if let Admission::Accept { delay_ms } = a {
                delays.push(delay_ms);
            }
        }
        assert_eq!(delays.len(), 20, "a rate delays, it does not refuse");
        assert_eq!(delays[0], 0);
        assert!(delays[19] > 0);

        let mut image = MetadataImage::default();
        image.client_quotas.insert(
            ClientQuotaEntity {
                user: None,
                client_id: None,
                ip: Some(QuotaEntityName::Default),
            },
            BTreeMap::from([(CONNECTION_CREATION_RATE.to_string(), QuotaValue(1.0))]),
        );
        let q = ConnectionQuotas::new(limits(usize::MAX), RateConfig::default());
        let outcomes: Vec<_> = (0..20).map(|_| q.admit("L", LOCAL, &image, 0).0).collect();
        assert_eq!(outcomes[0], Admission::Accept { delay_ms: 0 });
        assert!(matches!(outcomes[19], Admission::IpThrottled { .. }));
    }
}
