//! The dispatcher's security (docs/dispatcher/security.md): TLS on its
//! listeners ([`tls`]), who may call its APIs and do what with which queue
//! ([`auth`]), and the credential of the internal listener that forwarding
//! instances call ([`InternalAuth`]). Push signing is `crate::push::sign`.
//!
//! All of it is off unless configured (`[tls]`, `[auth]`, `[internal]`).

pub mod auth;
pub mod tls;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::{Config, InternalConfig};

/// The header that carries the internal secret from a forwarding instance
/// to a peer's internal listener.
pub const INTERNAL_SECRET_HEADER: &str = "dispatcher-internal-secret";

/// The server TLS configurations of the listeners, built from `[tls]` and
/// `[internal]`.
#[derive(Clone)]
pub struct ListenerTls {
    pub http: Arc<rustls::ServerConfig>,
    pub grpc: Arc<rustls::ServerConfig>,
    /// `[internal] tls = true`.
    pub internal: Option<Arc<rustls::ServerConfig>>,
}

/// The client-certificate requirement of a listener with `ca`.
fn client_auth(
    ca: Option<&std::path::Path>,
    required: bool,
) -> Option<(&std::path::Path, tls::ClientAuth)> {
    let auth = if required {
        tls::ClientAuth::Required
    } else {
        tls::ClientAuth::Optional
    };
    ca.map(|ca| (ca, auth))
}

impl ListenerTls {
    /// `None` without a `[tls]` table. Reads the PEM files.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<ListenerTls>> {
        let Some(t) = &config.tls else {
            return Ok(None);
        };
        tls::install_ring_provider();
        let public = client_auth(t.client_ca_file.as_deref(), t.client_cert_required);
        let http = tls::server_config(&t.cert_file, &t.key_file, public, &[b"http/1.1"])?;
        let grpc = tls::server_config(&t.cert_file, &t.key_file, public, &[b"h2"])?;
        let internal = if config.internal.tls {
            Some(tls::server_config(
                &t.cert_file,
                &t.key_file,
                client_auth(config.internal.client_ca_file.as_deref(), true),
                &[b"http/1.1"],
            )?)
        } else {
            None
        };
        Ok(Some(ListenerTls {
            http,
            grpc,
            internal,
        }))
    }
}

/// What the internal listener requires of a caller: the shared secret in
/// [`INTERNAL_SECRET_HEADER`] (when configured; a client certificate is
/// checked in the TLS handshake).
#[derive(Clone)]
pub struct InternalAuth {
    secret: Arc<[u8]>,
}

impl InternalAuth {
    pub fn new(config: &InternalConfig) -> Option<InternalAuth> {
        config.secret.as_ref().map(|s| InternalAuth {
            secret: Arc::from(s.as_slice()),
        })
    }

    /// The header value the forwarding client sends.
    pub fn header_value(&self) -> anyhow::Result<HeaderValue> {
        let mut v = HeaderValue::from_bytes(&self.secret)
            .map_err(|_| anyhow::anyhow!("the internal secret is not a valid header value"))?;
        v.set_sensitive(true);
        Ok(v)
    }

    /// Wraps the internal router: a request without the secret is answered
    /// 401 and reaches nothing.
    pub fn layer(self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(
            Arc::new(self),
            require_internal_secret,
        ))
    }
}

async fn require_internal_secret(
    State(auth): State<Arc<InternalAuth>>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(INTERNAL_SECRET_HEADER)
        .map(|v| v.as_bytes());
    match given {
        Some(given) if auth::constant_time_eq(given, &auth.secret) => next.run(request).await,
        _ => {
            metrics::counter!("dispatcher_internal_auth_failures_total").increment(1);
            (
                StatusCode::UNAUTHORIZED,
                [("content-type", "application/json")],
                r#"{"error":{"code":"unauthenticated","message":"the internal listener needs the internal secret"}}"#,
            )
                .into_response()
        }
    }
}
