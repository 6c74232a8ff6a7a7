//! The server side of Kafka's SASL mechanisms (PLAIN, SCRAM-SHA-256,
//! SCRAM-SHA-512, OAUTHBEARER) as pure state machines: bytes from the
//! client's SaslAuthenticate in, a [`Step`] out. Nothing here touches a
//! socket; the clock (OAUTHBEARER's expiry checks) is a [`Clock`] in the
//! [`MechanismConfig`], and SCRAM's credentials come from a
//! [`CredentialSource`] the broker implements over the metadata image.
//!
//! Failure messages are Kafka's: where Kafka's server raises a
//! `SaslAuthenticationException` its message reaches the client as is;
//! where it raises a plain `SaslException` (malformed messages, unknown
//! users, wrong SCRAM proofs) the client only gets Kafka's generic
//! "Authentication failed during authentication due to invalid credentials
//! with SASL mechanism X", so that nothing about the user leaks.

mod client;
pub mod jaas;
mod jwks;
mod oauthbearer;
mod plain;
mod scram;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use client::{client_authenticator, ClientAuthenticator, ClientStep, NoCredentials};
pub use scram::{ScramCredential, ScramMechanism};

/// `sasl.jaas.config`: the mechanism's JAAS login module and its options.
pub const SASL_JAAS_CONFIG: &str = "sasl.jaas.config";
/// A `file://` JWKS turns on the secured OAUTHBEARER validator.
pub const SASL_OAUTHBEARER_JWKS_ENDPOINT_URL: &str = "sasl.oauthbearer.jwks.endpoint.url";
pub const SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS: &str = "sasl.oauthbearer.clock.skew.seconds";
pub const SASL_OAUTHBEARER_EXPECTED_AUDIENCE: &str = "sasl.oauthbearer.expected.audience";
pub const SASL_OAUTHBEARER_EXPECTED_ISSUER: &str = "sasl.oauthbearer.expected.issuer";
pub const SASL_OAUTHBEARER_SUB_CLAIM_NAME: &str = "sasl.oauthbearer.sub.claim.name";
pub const SASL_OAUTHBEARER_SCOPE_CLAIM_NAME: &str = "sasl.oauthbearer.scope.claim.name";

/// A SASL mechanism the broker can enable, named as Kafka names it in
/// `sasl.enabled.mechanisms` and SaslHandshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl Mechanism {
    pub const ALL: [Mechanism; 4] = [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
        Mechanism::OAuthBearer,
    ];

    /// Kafka's name: "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER".
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A mechanism name this broker does not implement (GSSAPI, or a typo).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported SASL mechanism {0}")]
pub struct UnsupportedMechanism(pub String);

impl FromStr for Mechanism {
    type Err = UnsupportedMechanism;

    /// Exact, case-sensitive names, as Kafka's SaslHandshake compares them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnsupportedMechanism(s.to_owned()))
    }
}

/// What the server does after one client message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes as SaslAuthenticate's auth_bytes and wait for the next client message.
    Challenge(Vec<u8>),
    /// Authenticated: send `response` (may be empty) and use `principal` (the name, without "User:").
    /// `lifetime_ms`: for OAUTHBEARER the token's remaining lifetime (KIP-368's session_lifetime_ms is capped by it).
    Done {
        principal: String,
        response: Vec<u8>,
        lifetime_ms: Option<i64>,
    },
    /// Refused: `message` is what Kafka puts in SaslAuthenticate's error_message (Kafka's own wording).
    Failed { message: String },
}

/// One SASL exchange on one connection. After `Done` or `Failed` every
/// further step fails: a new exchange (re-authentication) takes a new
/// authenticator.
pub trait Authenticator: Send {
    fn step(&mut self, client_bytes: &[u8]) -> Step;
}

/// Where SCRAM credentials come from (the broker: the metadata image's
/// user SCRAM credentials).
pub trait CredentialSource: Send + Sync {
    fn scram(&self, mechanism: ScramMechanism, user: &str) -> Option<ScramCredential>;
}

/// The wall clock in epoch milliseconds. OAUTHBEARER checks token times
/// against it; it is a value so tests (and a simulated broker) can set it.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock, in epoch milliseconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    })
}

/// A mechanism's server configuration on one listener, built once from the
/// broker's configuration and shared by every connection's authenticator.
pub struct MechanismConfig {
    mechanism: Mechanism,
    settings: Settings,
    clock: Clock,
}

enum Settings {
    Plain(plain::PlainUsers),
    Scram(scram::ScramSettings),
    OAuthBearer(oauthbearer::Validator),
}

impl fmt::Debug for MechanismConfig {
    /// Only the mechanism: the settings hold passwords and keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MechanismConfig")
            .field("mechanism", &self.mechanism)
            .finish_non_exhaustive()
    }
}

/// A configuration key whose value cannot be used, with why, on one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SaslConfigError {
    pub key: String,
    pub reason: String,
}

impl SaslConfigError {
    fn new(key: &str, reason: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }
}

impl MechanismConfig {
    /// Builds `mech`'s configuration. `get` returns the effective value of a
    /// Kafka key for this listener and mechanism: the caller has already
    /// resolved `listener.name.<l>.<mech>.sasl.jaas.config` and the like to
    /// the plain key names used here.
    pub fn from_config(
        mech: Mechanism,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SaslConfigError> {
        let jaas = match get(SASL_JAAS_CONFIG) {
            Some(text) => Some(
                jaas::parse_single(&text)
                    .map_err(|e| SaslConfigError::new(SASL_JAAS_CONFIG, e.0))?,
            ),
            None => None,
        };
        let settings = match mech {
            Mechanism::Plain => Settings::Plain(plain::PlainUsers::from_jaas(jaas.as_ref())?),
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                Settings::Scram(scram::ScramSettings::new()?)
            }
            Mechanism::OAuthBearer => {
                Settings::OAuthBearer(oauthbearer::Validator::from_config(jaas.as_ref(), get)?)
            }
        };
        Ok(Self {
            mechanism: mech,
            settings,
            clock: system_clock(),
        })
    }

    /// Replaces the system clock (OAUTHBEARER's token times are checked
    /// against it).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }
}

/// A new exchange for `mech` on one connection. `cfg` must have been built
/// for `mech`; if it was not, every step fails with Kafka's generic message
/// rather than authenticating with the wrong mechanism's settings.
pub fn authenticator(
    mech: Mechanism,
    cfg: &Arc<MechanismConfig>,
    creds: &Arc<dyn CredentialSource>,
) -> Box<dyn Authenticator> {
    if cfg.mechanism != mech {
        return Box::new(Refuse(mech));
    }
    match (mech, &cfg.settings) {
        (Mechanism::Plain, Settings::Plain(_)) => Box::new(plain::PlainAuthenticator::new(cfg)),
        (Mechanism::ScramSha256, Settings::Scram(_)) => Box::new(scram::ScramAuthenticator::new(
            ScramMechanism::Sha256,
            cfg,
            creds,
        )),
        (Mechanism::ScramSha512, Settings::Scram(_)) => Box::new(scram::ScramAuthenticator::new(
            ScramMechanism::Sha512,
            cfg,
            creds,
        )),
        (Mechanism::OAuthBearer, Settings::OAuthBearer(_)) => {
            Box::new(oauthbearer::OAuthBearerAuthenticator::new(cfg))
        }
        _ => Box::new(Refuse(mech)),
    }
}

/// The authenticator for a configuration built for another mechanism.
struct Refuse(Mechanism);

impl Authenticator for Refuse {
    fn step(&mut self, _client_bytes: &[u8]) -> Step {
        invalid_credentials(self.0)
    }
}

/// Kafka's reply to a `SaslException`: it never says why, so that a
/// failure cannot tell an unknown user from a wrong password. (Kafka says
/// "re-authentication" instead of "authentication" when the connection is
/// re-authenticating; that is the caller's to substitute.)
fn invalid_credentials(mech: Mechanism) -> Step {
    Step::Failed {
        message: format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {mech}"
        ),
    }
}

/// Equality whose time does not depend on where the inputs differ (it
/// still depends on their lengths, which callers make equal or public).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests;
