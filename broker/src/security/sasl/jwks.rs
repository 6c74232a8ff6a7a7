//! A JWKS served over `http://` or `https://`, kept as Kafka's
//! `RefreshingHttpsJwks` keeps it:
//!
//! - fetched once while the configuration is built; a broker whose JWKS
//!   cannot be fetched does not start (Kafka: "Could not refresh JWKS");
//! - refreshed every `sasl.oauthbearer.jwks.endpoint.refresh.ms` (one hour)
//!   on a thread of its own, each refresh retried with backoff from
//!   `sasl.oauthbearer.jwks.endpoint.retry.backoff.ms` (100 ms) doubling for
//!   at most `sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms` (10 s); a
//!   refresh that fails keeps the keys already held;
//! - a token naming a key id the set does not hold fails, and asks for an
//!   early refresh: at most once a minute per key id, for at most 16 key ids
//!   at a time, and never for a key id longer than 1000 characters.
//!
//! Authentication never waits on the network: it reads the keys last
//! fetched. An `https://` endpoint is trusted through the truststore given
//! in the OAUTHBEARER JAAS options (`ssl.truststore.location` and the other
//! `ssl.truststore.*` keys, as Kafka reads them there), else through the
//! system's CA certificates.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use super::jaas::LoginModuleEntry;
use super::oauthbearer::{parse_jwks, VerificationKey};
use super::{SaslConfigError, SASL_OAUTHBEARER_JWKS_ENDPOINT_URL};
use crate::security::tls;

pub const SASL_OAUTHBEARER_JWKS_ENDPOINT_REFRESH_MS: &str =
    "sasl.oauthbearer.jwks.endpoint.refresh.ms";
pub const SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MS: &str =
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms";
pub const SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MAX_MS: &str =
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms";

/// Kafka's `MISSING_KEY_ID_CACHE_IN_FLIGHT_MS`, `MISSING_KEY_ID_CACHE_MAX_ENTRIES`
/// and `MISSING_KEY_ID_MAX_KEY_LENGTH`.
const MISSING_KEY_RETRY: Duration = Duration::from_secs(60);
const MISSING_KEYS_TRACKED: usize = 16;
const MISSING_KEY_ID_MAX_LEN: usize = 1000;

/// A JWKS document larger than this is refused rather than read into
/// memory; real ones are a few kilobytes.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The keys of one JWKS endpoint and what asks for their refresh.
pub(super) struct JwksEndpoint {
    url: String,
    keys: RwLock<Arc<Vec<VerificationKey>>>,
    /// Key ids recently asked for and not found, with when they may be
    /// asked for again; oldest first.
    missing: Mutex<VecDeque<(String, Instant)>>,
    wake: tokio::sync::Notify,
}

/// How often, and how persistently, the keys are fetched again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    refresh: Duration,
    backoff: Duration,
    backoff_max: Duration,
}

impl JwksEndpoint {
    /// Fetches the JWKS at `url` and starts the thread that refreshes it.
    pub(super) fn start(
        url: &str,
        jaas: Option<&LoginModuleEntry>,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Arc<Self>, SaslConfigError> {
        let schedule = Schedule {
            refresh: duration_ms(get, SASL_OAUTHBEARER_JWKS_ENDPOINT_REFRESH_MS, 3_600_000)?
                .max(Duration::from_millis(1)),
            backoff: duration_ms(get, SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MS, 100)?,
            backoff_max: duration_ms(
                get,
                SASL_OAUTHBEARER_JWKS_ENDPOINT_RETRY_BACKOFF_MAX_MS,
                10_000,
            )?,
        };
        let error =
            |reason: String| SaslConfigError::new(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, reason);
        let client = http_client(url, jaas).map_err(error)?;

        // The fetcher lives on its own thread with its own runtime, so the
        // first fetch can be waited for here whether or not the caller is
        // inside a runtime, and a refresh never takes a broker worker.
        let (first_tx, first_rx) = std::sync::mpsc::sync_channel(1);
        let url_owned = url.to_owned();
        std::thread::Builder::new()
            .name("jwks-refresh".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = first_tx.send(Err(format!("cannot start the JWKS fetcher: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let keys = match fetch(&client, &url_owned).await {
                        Ok(keys) => keys,
                        Err(reason) => {
                            let _ = first_tx.send(Err(reason));
                            return;
                        }
                    };
                    let endpoint = Arc::new(JwksEndpoint {
                        url: url_owned,
                        keys: RwLock::new(Arc::new(keys)),
                        missing: Mutex::new(VecDeque::new()),
                        wake: tokio::sync::Notify::new(),
                    });
                    let weak = Arc::downgrade(&endpoint);
                    if first_tx.send(Ok(endpoint)).is_err() {
                        return;
                    }
                    refresh_loop(weak, client, schedule).await;
                });
            })
            .map_err(|e| error(format!("cannot start the JWKS fetcher: {e}")))?;
        match first_rx.recv() {
            Ok(Ok(endpoint)) => Ok(endpoint),
            Ok(Err(reason)) => Err(error(format!(
                "Could not refresh JWKS from {url}: {reason}"
            ))),
            Err(_) => Err(error(format!("Could not refresh JWKS from {url}"))),
        }
    }

    /// The keys last fetched.
    pub(super) fn keys(&self) -> Arc<Vec<VerificationKey>> {
        Arc::clone(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// A token named `kid`, which the keys held do not have: ask for an
    /// early refresh unless this key id was asked for within the last
    /// minute. Returns whether a refresh was asked for.
    pub(super) fn key_missing(&self, kid: &str) -> bool {
        if kid.len() > MISSING_KEY_ID_MAX_LEN {
            return false;
        }
        let now = Instant::now();
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = missing.iter().position(|(id, _)| id == kid) {
            if missing[i].1 > now {
                return false;
            }
            missing.remove(i);
        }
        if missing.len() == MISSING_KEYS_TRACKED {
            missing.pop_front();
        }
        missing.push_back((kid.to_owned(), now + MISSING_KEY_RETRY));
        drop(missing);
        self.wake.notify_one();
        true
    }

    fn replace(&self, keys: Vec<VerificationKey>) {
        {
            let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
            missing.retain(|(id, _)| !keys.iter().any(|k| k.kid.as_deref() == Some(id)));
        }
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(keys);
    }
}

/// Refreshes on schedule or when woken, until the endpoint is dropped.
async fn refresh_loop(endpoint: Weak<JwksEndpoint>, client: reqwest::Client, schedule: Schedule) {
    loop {
        {
            // Held while waiting: a dropped endpoint ends this loop at its
            // next wake-up rather than at once.
            let Some(strong) = endpoint.upgrade() else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep(schedule.refresh) => {}
                () = strong.wake.notified() => {}
            }
        }
        let Some(url) = endpoint.upgrade().map(|e| e.url.clone()) else {
            return;
        };
        match fetch_with_retries(&client, &url, schedule).await {
            Ok(keys) => {
                let Some(strong) = endpoint.upgrade() else {
                    return;
                };
                strong.replace(keys);
                tracing::info!(url, "OAuth JWKS refreshed");
            }
            Err(reason) => tracing::warn!(
                url,
                reason,
                "OAuth JWKS refresh failed; keeping the keys already held"
            ),
        }
    }
}

/// Kafka's `Retry`: attempts until one succeeds or the backoff budget
/// (`backoff_max` from the first attempt) is spent, waiting `backoff`,
/// then twice that, and so on between attempts.
async fn fetch_with_retries(
    client: &reqwest::Client,
    url: &str,
    schedule: Schedule,
) -> Result<Vec<VerificationKey>, String> {
    let deadline = Instant::now() + schedule.backoff_max;
    let mut wait = schedule.backoff;
    loop {
        let error = match fetch(client, url).await {
            Ok(keys) => return Ok(keys),
            Err(e) => e,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(error);
        }
        tokio::time::sleep(wait.min(left)).await;
        wait = wait.saturating_mul(2);
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<Vec<VerificationKey>, String> {
    let mut response = client.get(url).send().await.map_err(|e| error_chain(&e))?;
    if !response.status().is_success() {
        return Err(format!("HTTP status {}", response.status()));
    }
    if response
        .content_length()
        .is_some_and(|n| n > MAX_DOCUMENT_BYTES as u64)
    {
        return Err(format!(
            "the document is larger than {MAX_DOCUMENT_BYTES} bytes"
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(format!(
                "the document is larger than {MAX_DOCUMENT_BYTES} bytes"
            ));
        }
        body.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(body).map_err(|_| "the document is not UTF-8".to_owned())?;
    parse_jwks(&text)
}

/// An error and its causes on one line (reqwest's own message is only the
/// outermost, e.g. "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn http_client(url: &str, jaas: Option<&LoginModuleEntry>) -> Result<reqwest::Client, String> {
    let tls = client_tls(url, jaas)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| error_chain(&e))
}

/// The TLS client for an `https://` endpoint: the truststore in the JAAS
/// options if they name one, else the system's CA certificates. (An
/// `http://` endpoint still gets one: the HTTP client wants it built.)
fn client_tls(url: &str, jaas: Option<&LoginModuleEntry>) -> Result<rustls::ClientConfig, String> {
    let options = jaas.map(|entry| &entry.options);
    let names_truststore = options.is_some_and(|o| o.keys().any(|k| k.starts_with("ssl.")));
    // ring, as for the listeners (see `TlsSettings::crypto_provider`).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    if names_truststore {
        let get = |key: &str| options.and_then(|o| o.get(key)).cloned();
        let settings = tls::TlsSettings::from_config(&get).map_err(|e| e.to_string())?;
        let config = tls::client_config(&settings).map_err(|e| e.to_string())?;
        return Ok((*config).clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    if url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    {
        let found = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(found.certs);
        if roots.is_empty() {
            return Err(format!(
                "no system CA certificates to trust {url} with; set ssl.truststore.location in the OAUTHBEARER JAAS options"
            ));
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn duration_ms(
    get: &dyn Fn(&str) -> Option<String>,
    key: &str,
    default: u64,
) -> Result<Duration, SaslConfigError> {
    match get(key) {
        None => Ok(Duration::from_millis(default)),
        Some(text) => text
            .trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| {
                SaslConfigError::new(
                    key,
                    format!("The OAuth configuration option {key} value must be a number of milliseconds of at least 0, not {text:?}"),
                )
            }),
    }
}
