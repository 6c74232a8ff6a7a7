//! The security half of the broker's config: which protocol each listener
//! speaks, which listener brokers use between themselves, and the per-listener
//! lookups of Kafka's `ssl.*` and `sasl.*` keys
//! (`listener.name.<listener>.<key>` first, then `<key>`).

use super::server::{ConfigError, Listener, ServerConfig};

/// Kafka's `SecurityProtocol`: what a listener's connections speak below
/// the Kafka protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether a client must authenticate with SASL before anything else.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// The SASL mechanisms this broker serves, by Kafka's names.
pub const SUPPORTED_SASL_MECHANISMS: [&str; 4] =
    ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// `listener.security.protocol.map`: `NAME:PROTOCOL` pairs.
pub(super) fn parse_protocol_map(
    key: &str,
    value: &str,
) -> Result<Vec<(String, SecurityProtocol)>, ConfigError> {
    let mut out: Vec<(String, SecurityProtocol)> = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, protocol) = part
            .split_once(':')
            .ok_or_else(|| super::server::invalid(key, value, "expected NAME:PROTOCOL pairs"))?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
            super::server::invalid(
                key,
                value,
                format!("unknown security protocol {protocol:?} (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"),
            )
        })?;
        let name = name.trim().to_string();
        if out.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) {
            return Err(super::server::invalid(
                key,
                value,
                format!("listener {name} named twice"),
            ));
        }
        out.push((name, protocol));
    }
    Ok(out)
}

impl ServerConfig {
    /// The protocol a listener speaks: from `listener.security.protocol.map`
    /// when it is set; otherwise a listener named after a protocol speaks
    /// it, and a controller listener speaks PLAINTEXT (Kafka's KRaft default
    /// for an unmapped controller listener).
    pub fn security_protocol(&self, listener: &str) -> Option<SecurityProtocol> {
        if !self.listener_security_protocol_map.is_empty() {
            return self
                .listener_security_protocol_map
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(listener))
                .map(|(_, p)| *p);
        }
        SecurityProtocol::parse(listener).or_else(|| {
            self.controller_listener_names
                .iter()
                .any(|c| c.eq_ignore_ascii_case(listener))
                .then_some(SecurityProtocol::Plaintext)
        })
    }

    /// The name of the listener brokers replicate and send markers over:
    /// `inter.broker.listener.name`, else the listener named after
    /// `security.inter.broker.protocol` (PLAINTEXT by default), as in Kafka.
    pub fn inter_broker_listener_name(&self) -> String {
        match (
            &self.inter_broker_listener_name,
            self.security_inter_broker_protocol,
        ) {
            (Some(name), _) => name.clone(),
            (None, Some(p)) => p.name().to_string(),
            (None, None) => SecurityProtocol::Plaintext.name().to_string(),
        }
    }

    /// The advertised endpoint of the inter-broker listener.
    pub fn advertised_inter_broker_listener(&self) -> &Listener {
        let name = self.inter_broker_listener_name();
        self.advertised_listeners
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(&name))
            .unwrap_or(&self.advertised_listeners[0])
    }

    /// A key's value for one listener: `listener.name.<listener>.<key>`
    /// (the listener name lower-cased, as Kafka's prefix is), else `<key>`.
    pub fn listener_value(&self, listener: &str, key: &str) -> Option<String> {
        let prefixed = format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
        self.explicit
            .get(&prefixed)
            .or_else(|| self.explicit.get(key))
            .cloned()
    }

    /// A SASL mechanism's key for one listener:
    /// `listener.name.<listener>.<mechanism>.<key>` (both lower-cased), then
    /// the listener's and the broker's value of `<key>`.
    pub fn mechanism_value(&self, listener: &str, mechanism: &str, key: &str) -> Option<String> {
        let prefixed = format!(
            "listener.name.{}.{}.{key}",
            listener.to_ascii_lowercase(),
            mechanism.to_ascii_lowercase()
        );
        self.explicit
            .get(&prefixed)
            .cloned()
            .or_else(|| self.listener_value(listener, key))
    }

    /// `sasl.enabled.mechanisms` for a listener (Kafka's default: GSSAPI).
    pub fn sasl_enabled_mechanisms(&self, listener: &str) -> Vec<String> {
        self.listener_value(listener, "sasl.enabled.mechanisms")
            .unwrap_or_else(|| "GSSAPI".into())
            .split(',')
            .map(|m| m.trim().to_ascii_uppercase())
            .filter(|m| !m.is_empty())
            .collect()
    }

    /// The security rules between listeners, checked at start: every
    /// listener has a protocol, the inter-broker listener exists and is not
    /// a controller listener, SASL listeners name mechanisms we serve, and
    /// what is not built yet (TLS or SASL between brokers and controllers)
    /// stops the broker with a message instead of quietly serving plaintext.
    pub(super) fn validate_security(&self) -> Result<(), ConfigError> {
        let err = |key: &str, value: &str, reason: String| {
            Err(super::server::invalid(key, value, reason))
        };
        if self.inter_broker_listener_name.is_some()
            && self.security_inter_broker_protocol.is_some()
        {
            return err(
                "security.inter.broker.protocol",
                self.security_inter_broker_protocol.map_or("", |p| p.name()),
                "only one of inter.broker.listener.name and security.inter.broker.protocol may be set".into(),
            );
        }
        for l in &self.listeners {
            let Some(protocol) = self.security_protocol(&l.name) else {
                return err(
                    "listener.security.protocol.map",
                    &l.name,
                    format!("no security protocol is defined for listener {}", l.name),
                );
            };
            let controller = self
                .controller_listener_names
                .iter()
                .any(|c| c.eq_ignore_ascii_case(&l.name));
            if controller && protocol != SecurityProtocol::Plaintext {
                return err(
                    "listener.security.protocol.map",
                    &l.name,
                    format!(
                        "controller listener {} uses {}, but this broker's controller quorum speaks only PLAINTEXT so far",
                        l.name,
                        protocol.name()
                    ),
                );
            }
            if protocol.uses_sasl() {
                let mechanisms = self.sasl_enabled_mechanisms(&l.name);
                if mechanisms.is_empty() {
                    return err(
                        "sasl.enabled.mechanisms",
                        "",
                        format!(
                            "listener {} uses {} but enables no mechanism",
                            l.name,
                            protocol.name()
                        ),
                    );
                }
                for m in &mechanisms {
                    if !SUPPORTED_SASL_MECHANISMS.contains(&m.as_str()) {
                        return err(
                            "sasl.enabled.mechanisms",
                            m,
                            format!(
                                "listener {}: mechanism {m} is not supported (supported: {}); GSSAPI (Kerberos) is Kafka's default, so set sasl.enabled.mechanisms",
                                l.name,
                                SUPPORTED_SASL_MECHANISMS.join(", ")
                            ),
                        );
                    }
                }
            }
        }
        let inter = self.inter_broker_listener_name();
        let key = if self.inter_broker_listener_name.is_some() {
            "inter.broker.listener.name"
        } else {
            "security.inter.broker.protocol"
        };
        let Some(listener) = self
            .advertised_listeners
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(&inter))
        else {
            return err(
                key,
                &inter,
                "the inter-broker listener must be one of advertised.listeners".into(),
            );
        };
        if let Some(protocol) = self.security_protocol(&listener.name) {
            if protocol != SecurityProtocol::Plaintext {
                return err(
                    key,
                    &inter,
                    format!(
                        "the inter-broker listener uses {}, but replication between brokers speaks only PLAINTEXT so far: put it on a PLAINTEXT listener",
                        protocol.name()
                    ),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<ServerConfig, ConfigError> {
        ServerConfig::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn listeners_named_after_protocols_speak_them() {
        let c = config(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094",
            ),
            ("sasl.enabled.mechanisms", "PLAIN"),
        ])
        .unwrap();
        assert_eq!(c.security_protocol("SSL"), Some(SecurityProtocol::Ssl));
        assert_eq!(
            c.security_protocol("SASL_SSL"),
            Some(SecurityProtocol::SaslSsl)
        );
        assert_eq!(
            c.security_protocol("CONTROLLER"),
            Some(SecurityProtocol::Plaintext)
        );
        assert_eq!(c.advertised_listeners.len(), 3);
        assert_eq!(c.advertised_inter_broker_listener().port, 9092);
    }

    #[test]
    fn the_map_names_any_listener() {
        let c = config(&[
            (
                "listeners",
                "INTERNAL://127.0.0.1:9092,EXTERNAL://127.0.0.1:9093",
            ),
            (
                "listener.security.protocol.map",
                "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,CONTROLLER:PLAINTEXT",
            ),
            ("inter.broker.listener.name", "INTERNAL"),
            (
                "listener.name.external.sasl.enabled.mechanisms",
                "SCRAM-SHA-512,PLAIN",
            ),
        ])
        .unwrap();
        assert_eq!(
            c.security_protocol("EXTERNAL"),
            Some(SecurityProtocol::SaslSsl)
        );
        assert_eq!(
            c.sasl_enabled_mechanisms("EXTERNAL"),
            vec!["SCRAM-SHA-512".to_string(), "PLAIN".to_string()]
        );
        assert_eq!(
            c.sasl_enabled_mechanisms("INTERNAL"),
            vec!["GSSAPI".to_string()]
        );
        assert_eq!(c.advertised_inter_broker_listener().name, "INTERNAL");
    }

    #[test]
    fn per_listener_and_per_mechanism_keys_override_the_broker_wide_ones() {
        let c = config(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093",
            ),
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("ssl.keystore.location", "/broker-wide"),
            ("listener.name.sasl_ssl.ssl.keystore.location", "/listener"),
            ("sasl.jaas.config", "broker-wide"),
            ("listener.name.sasl_ssl.plain.sasl.jaas.config", "mechanism"),
        ])
        .unwrap();
        assert_eq!(
            c.listener_value("SASL_SSL", "ssl.keystore.location")
                .as_deref(),
            Some("/listener")
        );
        assert_eq!(
            c.listener_value("PLAINTEXT", "ssl.keystore.location")
                .as_deref(),
            Some("/broker-wide")
        );
        assert_eq!(
            c.mechanism_value("SASL_SSL", "PLAIN", "sasl.jaas.config")
                .as_deref(),
            Some("mechanism")
        );
        assert_eq!(
            c.mechanism_value("SASL_SSL", "SCRAM-SHA-256", "sasl.jaas.config")
                .as_deref(),
            Some("broker-wide")
        );
    }

    #[test]
    fn what_cannot_be_served_stops_the_broker() {
        // A listener with no protocol.
        let e = config(&[(
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,EXTERNAL://127.0.0.1:9093",
        )])
        .unwrap_err();
        assert!(e.to_string().contains("no security protocol"), "{e}");
        // GSSAPI, Kafka's default mechanism.
        let e = config(&[(
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093",
        )])
        .unwrap_err();
        assert!(e.to_string().contains("GSSAPI"), "{e}");
        // An inter-broker listener that does not exist.
        let e = config(&[("listeners", "SSL://127.0.0.1:9093")]).unwrap_err();
        assert!(e.to_string().contains("inter-broker"), "{e}");
        // TLS between brokers, not built yet.
        let e = config(&[
            ("listeners", "SSL://127.0.0.1:9093"),
            ("security.inter.broker.protocol", "SSL"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("only PLAINTEXT so far"), "{e}");
        // Both inter-broker keys.
        let e = config(&[
            ("inter.broker.listener.name", "PLAINTEXT"),
            ("security.inter.broker.protocol", "PLAINTEXT"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("only one of"), "{e}");
        // A bad map.
        let e = config(&[("listener.security.protocol.map", "PLAINTEXT:TLS")]).unwrap_err();
        assert!(e.to_string().contains("unknown security protocol"), "{e}");
    }
}
