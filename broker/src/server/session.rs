//! Who a connection is: the principal its transport or its SASL exchange
//! established, and the SASL state machine of Kafka's
//! `SaslServerAuthenticator` that gets it there.
//!
//! On a SASL listener a client may send ApiVersions and SaslHandshake, then
//! SaslAuthenticate tokens until its mechanism says done (after a
//! SaslHandshake v0, which older clients send, the tokens come as bare
//! size-prefixed frames instead); anything else
//! before that closes the connection, as in Kafka ("Unexpected Kafka
//! request of type ... during SASL handshake"). A failed authentication is
//! answered with SASL_AUTHENTICATION_FAILED and the connection closes
//! `connection.failed.authentication.delay.ms` later. With
//! `connections.max.reauth.ms` (KIP-368) a session has a lifetime, told to
//! the client in SaslAuthenticate v1+; the client re-authenticates on the
//! same connection (handshake and tokens again, same mechanism and
//! principal), and a request after the session expired closes the
//! connection.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::time::Instant;

use super::ListenerContext;
use crate::broker::Broker;
use crate::security::sasl::{self, Authenticator, CredentialSource, Step};

/// Kafka's principal for a connection nobody authenticated.
pub const ANONYMOUS: &str = "User:ANONYMOUS";

enum State {
    /// Authenticated: by the transport (PLAINTEXT, SSL) or by SASL.
    Authenticated,
    /// A SASL listener's connection before (or between) handshakes.
    AwaitingHandshake,
    /// A mechanism chosen; its tokens arrive in SaslAuthenticate, or as
    /// bare frames after a SaslHandshake v0 (the connection's reader knows
    /// which).
    Authenticating {
        mechanism: String,
        authenticator: Box<dyn Authenticator>,
    },
}

/// What one token did.
enum Token {
    /// Send these bytes and wait for the next token.
    Reply(Vec<u8>),
    Done {
        response: Vec<u8>,
        lifetime_ms: Option<i64>,
    },
    Refused(ResponseError, String),
}

/// What the connection does with a request, as far as authentication goes.
pub enum Gate {
    /// Dispatch it.
    Pass,
    /// Close the connection (and say why in the log).
    Close(String),
}

/// What a SASL request's answer is, and whether the connection then closes
/// (after the failed-authentication delay).
pub struct SaslAnswer<R> {
    pub response: R,
    pub close_after: Option<Duration>,
}

pub struct Session {
    listener: Arc<ListenerContext>,
    credentials: Arc<dyn CredentialSource>,
    state: State,
    /// `User:<name>`.
    principal: Arc<str>,
    /// The SASL mechanism that authenticated the session (re-authentication
    /// must use the same).
    mechanism: Option<String>,
    /// When a SASL session ends (KIP-368).
    expires_at: Option<Instant>,
    reauth_ms: i64,
    failure_delay: Duration,
}

impl Session {
    pub fn new(
        broker: &Broker,
        listener: Arc<ListenerContext>,
        tls_principal: Option<String>,
    ) -> Self {
        let sasl = listener.protocol.uses_sasl();
        let principal: Arc<str> = match tls_principal {
            Some(name) if !sasl => Arc::from(format!("User:{name}").as_str()),
            _ => Arc::from(ANONYMOUS),
        };
        Self {
            listener,
            credentials: broker.scram_credentials(),
            state: if sasl {
                State::AwaitingHandshake
            } else {
                State::Authenticated
            },
            principal,
            mechanism: None,
            expires_at: None,
            reauth_ms: broker.config.connections_max_reauth_ms,
            failure_delay: Duration::from_millis(
                broker.config.connection_failed_authentication_delay_ms,
            ),
        }
    }

    pub fn principal(&self) -> &Arc<str> {
        &self.principal
    }

    /// Whether the connection is past its SASL exchange (frames are then
    /// bounded by `socket.request.max.bytes`, not the SASL receive size).
    pub fn authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated)
    }

    /// Whether a request other than the SASL ones may run now.
    pub fn gate(&self, api_key: kafka_protocol::messages::ApiKey) -> Gate {
        use kafka_protocol::messages::ApiKey;
        if api_key == ApiKey::ApiVersions {
            return Gate::Pass;
        }
        match &self.state {
            State::Authenticated => match self.expires_at {
                Some(at) if Instant::now() >= at => Gate::Close(format!(
                    "{api_key:?} after the SASL session expired (connections.max.reauth.ms)"
                )),
                _ => Gate::Pass,
            },
            _ => Gate::Close(format!(
                "Unexpected Kafka request of type {api_key:?} during SASL handshake."
            )),
        }
    }

    /// SaslHandshake: on a SASL listener, chooses the mechanism (a client
    /// re-authenticating must keep its own); elsewhere ILLEGAL_SASL_STATE.
    pub fn handshake(
        &mut self,
        version: i16,
        req: &SaslHandshakeRequest,
    ) -> SaslAnswer<SaslHandshakeResponse> {
        let enabled: Vec<StrBytes> = self
            .listener
            .sasl
            .iter()
            .flatten()
            .map(|m| StrBytes::from_string(m.name.clone()))
            .collect();
        let answer = |code: ResponseError, close: bool| SaslAnswer {
            response: SaslHandshakeResponse::default()
                .with_error_code(code.code())
                .with_mechanisms(enabled.clone()),
            close_after: close.then_some(Duration::ZERO),
        };
        let Some(mechanisms) = &self.listener.sasl else {
            return answer(ResponseError::IllegalSaslState, true);
        };
        let requested = req.mechanism.to_string();
        let reauthenticating = match &self.state {
            State::AwaitingHandshake => false,
            // Re-authentication (KIP-368) needs SaslAuthenticate: v1.
            State::Authenticated if self.mechanism.is_some() && version >= 1 => true,
            _ => return answer(ResponseError::IllegalSaslState, true),
        };
        let Some(enabled_mechanism) = mechanisms.iter().find(|m| m.name == requested) else {
            return answer(ResponseError::UnsupportedSaslMechanism, true);
        };
        if reauthenticating && self.mechanism.as_deref() != Some(requested.as_str()) {
            return answer(ResponseError::UnsupportedSaslMechanism, true);
        }
        self.state = State::Authenticating {
            mechanism: requested,
            authenticator: sasl::authenticator(
                enabled_mechanism.mechanism,
                &enabled_mechanism.config,
                &self.credentials,
            ),
        };
        SaslAnswer {
            response: SaslHandshakeResponse::default().with_mechanisms(enabled),
            close_after: None,
        }
    }

    /// SaslAuthenticate: one token of the chosen mechanism.
    pub fn authenticate(
        &mut self,
        version: i16,
        req: &SaslAuthenticateRequest,
    ) -> SaslAnswer<SaslAuthenticateResponse> {
        let (outcome, close_after) = self.token(&req.auth_bytes);
        let response = match outcome {
            Token::Reply(bytes) => {
                SaslAuthenticateResponse::default().with_auth_bytes(bytes.into())
            }
            Token::Done {
                response,
                lifetime_ms,
            } => {
                let mut r = SaslAuthenticateResponse::default().with_auth_bytes(response.into());
                if version >= 1 {
                    r.session_lifetime_ms = lifetime_ms.unwrap_or(0);
                }
                r
            }
            Token::Refused(code, message) => SaslAuthenticateResponse::default()
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message))),
        };
        SaslAnswer {
            response,
            close_after,
        }
    }

    /// One token after a SaslHandshake v0: it came as a bare size-prefixed
    /// frame, and the answer goes back as one (`None`: no answer, the
    /// connection closes, as Kafka closes it on a failed v0 exchange).
    pub fn raw_token(&mut self, token: &[u8]) -> SaslAnswer<Option<Vec<u8>>> {
        let (outcome, close_after) = self.token(token);
        let response = match outcome {
            Token::Reply(bytes) => Some(bytes),
            Token::Done { response, .. } => Some(response),
            Token::Refused(..) => None,
        };
        SaslAnswer {
            response,
            close_after,
        }
    }

    fn token(&mut self, bytes: &[u8]) -> (Token, Option<Duration>) {
        let State::Authenticating {
            mechanism,
            authenticator,
        } = &mut self.state
        else {
            return (
                Token::Refused(
                    ResponseError::IllegalSaslState,
                    "Unexpected SaslAuthenticate request with no SASL handshake".into(),
                ),
                Some(Duration::ZERO),
            );
        };
        let mechanism = mechanism.clone();
        match authenticator.step(bytes) {
            Step::Challenge(bytes) => (Token::Reply(bytes), None),
            Step::Failed { message } => self.failed(&mechanism, message),
            Step::Done {
                principal,
                response,
                lifetime_ms,
            } => {
                let principal = format!("User:{principal}");
                if self.mechanism.is_some() && *self.principal != *principal {
                    let message = format!(
                        "Cannot change principals during re-authentication from {}: {principal}",
                        self.principal
                    );
                    return self.failed(&mechanism, message);
                }
                // The session lasts connections.max.reauth.ms, or less if the
                // credential (an OAUTHBEARER token) expires sooner.
                let lifetime_ms = match (self.reauth_ms > 0, lifetime_ms) {
                    (true, Some(token)) => Some(self.reauth_ms.min(token.max(0))),
                    (true, None) => Some(self.reauth_ms),
                    (false, Some(token)) => Some(token.max(0)),
                    (false, None) => None,
                };
                self.expires_at =
                    lifetime_ms.map(|ms| Instant::now() + Duration::from_millis(ms as u64));
                self.principal = Arc::from(principal.as_str());
                self.mechanism = Some(mechanism.clone());
                self.state = State::Authenticated;
                metrics::counter!("kafka_broker_authentications_total", "listener" => self.listener.name.to_string(), "mechanism" => mechanism, "result" => "success")
                    .increment(1);
                (
                    Token::Done {
                        response,
                        lifetime_ms,
                    },
                    None,
                )
            }
        }
    }

    fn failed(&mut self, mechanism: &str, message: String) -> (Token, Option<Duration>) {
        tracing::info!(listener = %self.listener.name, mechanism, %message, "authentication failed");
        metrics::counter!("kafka_broker_authentications_total", "listener" => self.listener.name.to_string(), "mechanism" => mechanism.to_string(), "result" => "failure")
            .increment(1);
        self.state = State::AwaitingHandshake;
        (
            Token::Refused(ResponseError::SaslAuthenticationFailed, message),
            Some(self.failure_delay),
        )
    }
}
