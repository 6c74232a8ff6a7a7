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

/// `sasl.mechanism.inter.broker.protocol`: how brokers log in to each other's inter-broker listener.
pub const SASL_MECHANISM_INTER_BROKER_PROTOCOL: &str = "sasl.mechanism.inter.broker.protocol";
/// `sasl.mechanism.controller.protocol`: how voters log in to each other's controller listener.
pub const SASL_MECHANISM_CONTROLLER_PROTOCOL: &str = "sasl.mechanism.controller.protocol";
/// What a broker can log in with between brokers (OAUTHBEARER would need a token source).
pub const INTER_BROKER_SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
/// What voters log in with: SCRAM credentials live in the quorum the
/// controller listener carries, so they cannot authenticate its own voters.
pub const CONTROLLER_SASL_MECHANISMS: [&str; 1] = ["PLAIN"];

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

    /// The mechanism this broker logs in with on a SASL listener it dials:
    /// `key` is `sasl.mechanism.inter.broker.protocol` or
    /// `sasl.mechanism.controller.protocol` (Kafka's default for both is
    /// GSSAPI, which is not served; `None` here).
    pub fn peer_sasl_mechanism(&self, key: &str) -> Option<String> {
        self.explicit
            .get(key)
            .map(|m| m.trim().to_ascii_uppercase())
    }

    /// The username and password this broker logs in with on `listener`
    /// with `mechanism`, as Kafka's login modules read them: the
    /// `username` and `password` options of the listener's JAAS config for
    /// that mechanism.
    pub fn peer_sasl_login(
        &self,
        listener: &str,
        mechanism: &str,
    ) -> Result<(String, String), String> {
        let key = format!(
            "listener.name.{}.{}.sasl.jaas.config",
            listener.to_ascii_lowercase(),
            mechanism.to_ascii_lowercase()
        );
        let Some(text) = self.mechanism_value(listener, mechanism, "sasl.jaas.config") else {
            return Err(format!(
                "{key} is not set: this broker logs in to its peers on listener {listener} with the username and password of that JAAS config"
            ));
        };
        let entry =
            crate::security::sasl::jaas::parse_single(&text).map_err(|e| format!("{key}: {e}"))?;
        match (entry.options.get("username"), entry.options.get("password")) {
            (Some(u), Some(p)) => Ok((u.clone(), p.clone())),
            _ => Err(format!(
                "{key} has no username=\"...\" password=\"...\" options: this broker logs in to its peers on listener {listener} with them"
            )),
        }
    }

    /// `super.users` (`User:a;User:b`), when set: the voters the
    /// controller listener admits.
    pub fn voter_principals(&self) -> Option<Vec<String>> {
        self.explicit
            .contains_key("super.users")
            .then(|| self.super_users.clone())
    }

    /// A SASL listener this broker dials (inter-broker or controller): its
    /// mechanism is set, served, enabled on the listener, and its JAAS
    /// config names the broker's own login.
    fn validate_peer_login(
        &self,
        listener: &str,
        key: &str,
        allowed: &[&str],
    ) -> Result<(), ConfigError> {
        let mechanism = self.peer_sasl_mechanism(key);
        let shown = mechanism.clone().unwrap_or_default();
        let Some(m) = mechanism.filter(|m| allowed.contains(&m.as_str())) else {
            return Err(super::server::invalid(
                key,
                &shown,
                format!(
                    "listener {listener} uses SASL and this broker logs in to its peers there: set {key} to one of {} (Kafka's default, GSSAPI, is not supported)",
                    allowed.join(", ")
                ),
            ));
        };
        if !self.sasl_enabled_mechanisms(listener).contains(&m) {
            return Err(super::server::invalid(
                key,
                &m,
                format!("{m} is not in sasl.enabled.mechanisms of listener {listener}"),
            ));
        }
        self.peer_sasl_login(listener, &m)
            .map(|_| ())
            .map_err(|reason| super::server::invalid(key, &m, reason))
    }

    /// The security rules between listeners, checked at start: every
    /// listener has a protocol, the inter-broker listener exists and is not
    /// a controller listener, SASL listeners name mechanisms we serve, and a
    /// secured inter-broker or controller listener has what this broker
    /// needs to dial it (a mechanism and its own login in the JAAS config; a
    /// client certificate is required on an SSL controller listener).
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
            if protocol.uses_sasl() {
                self.validate_peer_login(
                    &listener.name,
                    SASL_MECHANISM_INTER_BROKER_PROTOCOL,
                    &INTER_BROKER_SASL_MECHANISMS,
                )?;
            }
        }
        if let Some(controller) = self.controller_listener() {
            match self.security_protocol(&controller.name) {
                Some(SecurityProtocol::Ssl) => {
                    let auth = self.listener_value(&controller.name, "ssl.client.auth");
                    if !auth
                        .as_deref()
                        .is_some_and(|a| a.trim().eq_ignore_ascii_case("required"))
                    {
                        return err(
                            "ssl.client.auth",
                            auth.as_deref().unwrap_or(""),
                            format!(
                                "controller listener {} uses SSL, so voters authenticate each other by certificate: set listener.name.{}.ssl.client.auth=required",
                                controller.name,
                                controller.name.to_ascii_lowercase()
                            ),
                        );
                    }
                }
                Some(p) if p.uses_sasl() => {
                    self.validate_peer_login(
                        &controller.name,
                        SASL_MECHANISM_CONTROLLER_PROTOCOL,
                        &CONTROLLER_SASL_MECHANISMS,
                    )?;
                }
                _ => {}
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
        // TLS between brokers is served (its keystore is loaded at start).
        config(&[
            ("listeners", "SSL://127.0.0.1:9093"),
            ("security.inter.broker.protocol", "SSL"),
        ])
        .unwrap();
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

    const LOGIN: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" password="pw" user_broker="pw";"#;

    fn secured(extra: &[(&str, &str)]) -> Result<ServerConfig, ConfigError> {
        let mut pairs = vec![
            ("node.id", "1"),
            ("process.roles", "broker,controller"),
            (
                "listeners",
                "INTERNAL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            ),
            ("inter.broker.listener.name", "INTERNAL"),
            ("controller.listener.names", "CONTROLLER"),
            ("controller.quorum.voters", "1@127.0.0.1:9093"),
        ];
        pairs.extend_from_slice(extra);
        config(&pairs)
    }

    #[test]
    fn secured_peer_listeners_need_a_mechanism_and_the_brokers_own_login() {
        let ok = secured(&[
            (
                "listener.security.protocol.map",
                "INTERNAL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            ),
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-512"),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
            ("sasl.mechanism.controller.protocol", "PLAIN"),
            (
                "listener.name.internal.scram-sha-512.sasl.jaas.config",
                LOGIN,
            ),
            ("listener.name.controller.plain.sasl.jaas.config", LOGIN),
            ("super.users", "User:broker; User:CN=b1"),
        ])
        .unwrap();
        assert_eq!(
            ok.peer_sasl_login("INTERNAL", "SCRAM-SHA-512"),
            Ok(("broker".to_string(), "pw".to_string()))
        );
        assert_eq!(
            ok.voter_principals(),
            Some(vec!["User:broker".to_string(), "User:CN=b1".to_string()])
        );

        let map = (
            "listener.security.protocol.map",
            "INTERNAL:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        );
        // Kafka's default mechanism between brokers is GSSAPI.
        let e = secured(&[map, ("sasl.enabled.mechanisms", "PLAIN")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("sasl.mechanism.inter.broker.protocol"),
            "{e}"
        );
        // A mechanism the listener does not enable.
        let e = secured(&[
            map,
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-256"),
        ])
        .unwrap_err();
        assert!(
            e.to_string().contains("not in sasl.enabled.mechanisms"),
            "{e}"
        );
        // A JAAS config with users to check but no login of its own.
        let e = secured(&[
            map,
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
            (
                "listener.name.internal.plain.sasl.jaas.config",
                r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_broker="pw";"#,
            ),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("username"), "{e}");
        // No JAAS config at all.
        let e = secured(&[
            map,
            ("sasl.enabled.mechanisms", "PLAIN"),
            ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("listener.name.internal.plain.sasl.jaas.config is not set"),
            "{e}"
        );
        // SCRAM cannot authenticate the voters of the quorum that stores it.
        let e = secured(&[
            (
                "listener.security.protocol.map",
                "INTERNAL:PLAINTEXT,CONTROLLER:SASL_SSL",
            ),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256"),
            ("sasl.mechanism.controller.protocol", "SCRAM-SHA-256"),
        ])
        .unwrap_err();
        assert!(
            e.to_string().contains("sasl.mechanism.controller.protocol"),
            "{e}"
        );
        // An SSL controller listener must ask for certificates.
        let e = secured(&[(
            "listener.security.protocol.map",
            "INTERNAL:PLAINTEXT,CONTROLLER:SSL",
        )])
        .unwrap_err();
        assert!(e.to_string().contains("ssl.client.auth=required"), "{e}");
        secured(&[
            (
                "listener.security.protocol.map",
                "INTERNAL:SSL,CONTROLLER:SSL",
            ),
            ("listener.name.controller.ssl.client.auth", "required"),
        ])
        .unwrap();
    }
}
