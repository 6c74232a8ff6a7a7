//! Security between this broker and its peers: what it presents when it
//! dials another broker's inter-broker listener or another voter's
//! controller listener ([`PeerSecurity`]), and how the controller listener
//! authenticates and authorizes the voters that dial it ([`PeerServerAuth`]).
//!
//! Kafka reads the dialled listener's own keys for the client role too: the
//! TLS client uses `listener.name.<l>.ssl.*` (its truststore to check the
//! peer, its keystore as the client certificate for mTLS), and the SASL
//! client logs in with the `username`/`password` options of
//! `listener.name.<l>.<mechanism>.sasl.jaas.config`, the mechanism being
//! `sasl.mechanism.inter.broker.protocol` or
//! `sasl.mechanism.controller.protocol`. The SASL exchange itself belongs
//! to the protocol spoken on the connection (Kafka's SaslHandshake and
//! SaslAuthenticate in `net`, a JSON handshake in the metadata transport).

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::config::{SecurityProtocol, ServerConfig};
use crate::security::sasl::{
    client_authenticator, ClientAuthenticator, Mechanism, MechanismConfig,
};
use crate::security::tls::{self, PrincipalMapper, ReloadingAcceptor, TlsSettings};

/// A connection to a peer, TLS or not.
pub trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> PeerIo for T {}
pub type PeerStream = Box<dyn PeerIo>;

/// How this broker dials one kind of peer listener.
pub struct PeerSecurity {
    listener: String,
    protocol: SecurityProtocol,
    tls: Option<Arc<rustls::ClientConfig>>,
    login: Option<SaslLogin>,
}

/// The mechanism and credentials this broker logs in with.
struct SaslLogin {
    mechanism: Mechanism,
    username: String,
    password: tls::Password,
}

impl std::fmt::Debug for PeerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSecurity")
            .field("listener", &self.listener)
            .field("protocol", &self.protocol)
            .field("mechanism", &self.login.as_ref().map(|l| l.mechanism))
            .finish_non_exhaustive()
    }
}

impl PeerSecurity {
    /// Plain TCP, no login: a cluster of one, and tests.
    pub fn plaintext() -> Self {
        Self {
            listener: "PLAINTEXT".into(),
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            login: None,
        }
    }

    /// For replica fetchers and transaction markers: the inter-broker listener's.
    pub fn inter_broker(config: &ServerConfig) -> Result<Self, String> {
        let listener = config.inter_broker_listener_name();
        Self::for_listener(
            config,
            &listener,
            crate::config::SASL_MECHANISM_INTER_BROKER_PROTOCOL,
        )
    }

    /// For calls between voters: the controller listener's (every voter's
    /// controller listener is configured alike).
    pub fn controller(config: &ServerConfig) -> Result<Self, String> {
        match config.controller_listener() {
            Some(l) => Self::for_listener(
                config,
                &l.name,
                crate::config::SASL_MECHANISM_CONTROLLER_PROTOCOL,
            ),
            None => Ok(Self::plaintext()),
        }
    }

    fn for_listener(
        config: &ServerConfig,
        listener: &str,
        mechanism_key: &str,
    ) -> Result<Self, String> {
        let protocol = config
            .security_protocol(listener)
            .ok_or_else(|| format!("no security protocol for listener {listener}"))?;
        let tls = if protocol.uses_tls() {
            let get = |key: &str| config.listener_value(listener, key);
            let settings = TlsSettings::from_config(&get).map_err(|e| e.to_string())?;
            Some(tls::client_config(&settings).map_err(|e| {
                format!("{e} (this broker dials its peers on listener {listener} with it)")
            })?)
        } else {
            None
        };
        let login = if protocol.uses_sasl() {
            let name = config.peer_sasl_mechanism(mechanism_key).ok_or_else(|| {
                format!(
                    "listener {listener} uses {}: set {mechanism_key}",
                    protocol.name()
                )
            })?;
            let mechanism: Mechanism = name
                .parse()
                .map_err(|e: crate::security::sasl::UnsupportedMechanism| e.to_string())?;
            let (username, password) = config.peer_sasl_login(listener, &name)?;
            Some(SaslLogin {
                mechanism,
                username,
                password: tls::Password::new(password),
            })
        } else {
            None
        };
        Ok(Self {
            listener: listener.to_string(),
            protocol,
            tls,
            login,
        })
    }

    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// Wraps a connection to `host` in TLS when the listener speaks it
    /// (the peer's certificate checked against the truststore, and its
    /// name too unless `ssl.endpoint.identification.algorithm` is empty).
    pub async fn secure(&self, tcp: TcpStream, host: &str) -> std::io::Result<PeerStream> {
        let Some(tls) = &self.tls else {
            return Ok(Box::new(tcp));
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
        })?;
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await?;
        Ok(Box::new(stream))
    }

    /// The mechanism and a fresh client exchange, when the listener speaks SASL.
    pub fn sasl_client(&self) -> Option<(Mechanism, Box<dyn ClientAuthenticator>)> {
        let login = self.login.as_ref()?;
        // The mechanism was checked to have a client when this was built.
        let client =
            client_authenticator(login.mechanism, &login.username, login.password.expose()).ok()?;
        Some((login.mechanism, client))
    }
}

/// How the controller listener admits a voter: TLS (a client certificate is
/// required on SSL), a SASL login (PLAIN) on SASL_*, then the principal
/// must be one of `super.users` when that is set (Kafka requires
/// CLUSTER_ACTION; until this broker has an authorizer, super users are
/// what it grants to).
pub struct PeerServerAuth {
    protocol: SecurityProtocol,
    tls: Option<(Arc<ReloadingAcceptor>, PrincipalMapper)>,
    sasl: Vec<(Mechanism, Arc<MechanismConfig>)>,
    super_users: Option<Vec<String>>,
}

/// Why a peer was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum PeerAuthError {
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("no client certificate")]
    NoCertificate,
    #[error("{0}")]
    Principal(#[from] tls::PrincipalError),
}

impl PeerServerAuth {
    pub fn plaintext() -> Self {
        Self {
            protocol: SecurityProtocol::Plaintext,
            tls: None,
            sasl: Vec::new(),
            super_users: None,
        }
    }

    /// The controller listener's, from its keys (`validate()` has checked
    /// that an SSL one requires client certificates and a SASL one serves PLAIN).
    pub fn controller(config: &ServerConfig) -> Result<Self, String> {
        let Some(l) = config.controller_listener() else {
            return Ok(Self::plaintext());
        };
        let name = &l.name;
        let protocol = config
            .security_protocol(name)
            .ok_or_else(|| format!("no security protocol for listener {name}"))?;
        let tls = if protocol.uses_tls() {
            let get = |key: &str| config.listener_value(name, key);
            let settings = TlsSettings::from_config(&get).map_err(|e| e.to_string())?;
            let mapper = PrincipalMapper::parse(
                &get("ssl.principal.mapping.rules").unwrap_or_else(|| "DEFAULT".into()),
            )
            .map_err(|e| e.to_string())?;
            Some((
                Arc::new(ReloadingAcceptor::new(settings).map_err(|e| e.to_string())?),
                mapper,
            ))
        } else {
            None
        };
        let mut sasl = Vec::new();
        if protocol.uses_sasl() {
            for m in config.sasl_enabled_mechanisms(name) {
                let Ok(mechanism) = m.parse::<Mechanism>() else {
                    continue;
                };
                if mechanism != Mechanism::Plain {
                    // SCRAM's credentials are in the quorum this listener carries.
                    continue;
                }
                let get = |key: &str| config.mechanism_value(name, &m, key);
                let cfg =
                    MechanismConfig::from_config(mechanism, &get).map_err(|e| e.to_string())?;
                sasl.push((mechanism, Arc::new(cfg)));
            }
            if sasl.is_empty() {
                return Err(format!(
                    "controller listener {name} uses {} but does not enable PLAIN",
                    protocol.name()
                ));
            }
        }
        Ok(Self {
            protocol,
            tls,
            sasl,
            super_users: config.voter_principals(),
        })
    }

    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The TLS acceptor, for the listener to watch its files.
    pub fn acceptor(&self) -> Option<Arc<ReloadingAcceptor>> {
        self.tls.as_ref().map(|(a, _)| a.clone())
    }

    /// The TLS handshake when the listener speaks TLS, and the principal of
    /// the client certificate (required on SSL, ignored on SASL_SSL, where
    /// the SASL login names the principal).
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> Result<(PeerStream, Option<String>), PeerAuthError> {
        let Some((acceptor, mapper)) = &self.tls else {
            return Ok((Box::new(tcp), None));
        };
        let stream = acceptor
            .acceptor()
            .accept(tcp)
            .await
            .map_err(PeerAuthError::Tls)?;
        if self.protocol.uses_sasl() {
            return Ok((Box::new(stream), None));
        }
        let principal =
            tls::peer_principal(stream.get_ref().1, mapper)?.ok_or(PeerAuthError::NoCertificate)?;
        Ok((Box::new(stream), Some(principal)))
    }

    /// The configuration of a SASL mechanism a voter asked for, if served.
    pub fn mechanism(&self, name: &str) -> Option<(Mechanism, Arc<MechanismConfig>)> {
        self.sasl
            .iter()
            .find(|(m, _)| m.name() == name)
            .map(|(m, c)| (*m, c.clone()))
    }

    /// Whether an authenticated principal (its name, without `User:`) may
    /// act as a voter.
    pub fn authorized(&self, principal: &str) -> bool {
        match &self.super_users {
            Some(users) => users.iter().any(|u| u == &format!("User:{principal}")),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn super_users_bound_who_may_be_a_voter() {
        let mut auth = PeerServerAuth::plaintext();
        assert!(auth.authorized("anyone"));
        auth.super_users = Some(vec!["User:CN=broker1".into(), "User:admin".into()]);
        assert!(auth.authorized("CN=broker1"));
        assert!(auth.authorized("admin"));
        assert!(!auth.authorized("alice"));
        assert!(!auth.authorized("User:admin"));
    }
}
