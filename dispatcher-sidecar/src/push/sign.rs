//! Authenticated push deliveries (`[queue.push.auth]`,
//! docs/dispatcher/security.md): an OIDC-style JWT in `authorization`
//! (audience: the endpoint URL, as Pub/Sub push does) and/or an HMAC of the
//! body in a signature header (as webhook senders do). The formats are
//! documented for receivers; a test verifies both.

use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac as _};
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};
use sha2::Sha256;

use crate::config::{PushAuth, PushHmac, PushJwt};

/// The headers that authenticate one push request.
pub struct Signer {
    jwt: Option<JwtSigner>,
    hmac: Option<(HeaderName, Vec<u8>)>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("jwt", &self.jwt.is_some())
            .field("hmac", &self.hmac.as_ref().map(|(h, _)| h))
            .finish()
    }
}

struct JwtSigner {
    key: jsonwebtoken::EncodingKey,
    header: jsonwebtoken::Header,
    issuer: String,
    audience: String,
    subject: String,
    lifetime: Duration,
    /// The last token and its `iat` (s): reused while less than half its
    /// lifetime has passed, so a busy subscription signs about once a
    /// minute rather than per message.
    current: Mutex<Option<(HeaderValue, u64)>>,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

impl Signer {
    /// `None` when the subscription signs nothing. `queue` is the JWT's
    /// `sub`. Reads the signing key.
    pub fn new(auth: &PushAuth, queue: &str) -> anyhow::Result<Option<Signer>> {
        if auth.jwt.is_none() && auth.hmac.is_none() {
            return Ok(None);
        }
        Ok(Some(Signer {
            jwt: auth
                .jwt
                .as_ref()
                .map(|j| JwtSigner::new(j, queue))
                .transpose()?,
            hmac: auth.hmac.as_ref().map(hmac_parts).transpose()?,
        }))
    }

    /// The headers for a request with this body, at `now_s` (Unix seconds).
    pub fn headers(&self, body: &[u8], now_s: u64) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(2);
        if let Some(jwt) = &self.jwt {
            match jwt.token(now_s) {
                Ok(v) => out.push((AUTHORIZATION, v)),
                // Cannot happen with a key that loaded; the request goes
                // unsigned and the endpoint refuses it (a retryable failure).
                Err(e) => tracing::error!("signing a push JWT: {e}"),
            }
        }
        if let Some((name, secret)) = &self.hmac {
            let value = hmac_signature(secret, now_s, body);
            if let Ok(v) = HeaderValue::from_str(&value) {
                out.push((name.clone(), v));
            }
        }
        out
    }
}

fn hmac_parts(h: &PushHmac) -> anyhow::Result<(HeaderName, Vec<u8>)> {
    Ok((
        HeaderName::from_bytes(h.header.as_bytes())?,
        h.secret.clone(),
    ))
}

/// `t=<now_s>,v1=<lowercase hex HMAC-SHA256(secret, "<now_s>." + body)>`.
pub fn hmac_signature(secret: &[u8], now_s: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(now_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    format!("t={now_s},v1={hex}")
}

impl JwtSigner {
    fn new(j: &PushJwt, queue: &str) -> anyhow::Result<JwtSigner> {
        let pem = std::fs::read(&j.key_file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", j.key_file.display()))?;
        let (algorithm, key) = match j.algorithm.as_str() {
            "RS256" => (
                jsonwebtoken::Algorithm::RS256,
                jsonwebtoken::EncodingKey::from_rsa_pem(&pem),
            ),
            "ES256" => (
                jsonwebtoken::Algorithm::ES256,
                jsonwebtoken::EncodingKey::from_ec_pem(&pem),
            ),
            other => anyhow::bail!("push JWT algorithm {other:?} is not RS256 or ES256"),
        };
        let key = key.map_err(|e| {
            anyhow::anyhow!("{}: not a {} key: {e}", j.key_file.display(), j.algorithm)
        })?;
        let mut header = jsonwebtoken::Header::new(algorithm);
        header.kid = j.key_id.clone();
        let signer = JwtSigner {
            key,
            header,
            issuer: j.issuer.clone(),
            audience: j.audience.clone(),
            subject: queue.to_string(),
            lifetime: j.lifetime,
            current: Mutex::new(None),
        };
        // Sign once now: a key of the wrong kind fails at start, not per push.
        signer.token(jsonwebtoken::get_current_timestamp())?;
        Ok(signer)
    }

    fn token(&self, now_s: u64) -> anyhow::Result<HeaderValue> {
        let lifetime_s = self.lifetime.as_secs().max(1);
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((value, iat)) = &*current {
            if now_s >= *iat && now_s - iat < lifetime_s / 2 {
                return Ok(value.clone());
            }
        }
        let claims = Claims {
            iss: &self.issuer,
            sub: &self.subject,
            aud: &self.audience,
            iat: now_s,
            exp: now_s + lifetime_s,
        };
        let jwt = jsonwebtoken::encode(&self.header, &claims, &self.key)?;
        let mut value = HeaderValue::from_str(&format!("Bearer {jwt}"))?;
        value.set_sensitive(true);
        *current = Some((value.clone(), now_s));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hmac_header_is_the_documented_format() {
        // Recomputed by hand: HMAC-SHA256("0123456789abcdef", "1700000000.{\"a\":1}").
        let v = hmac_signature(b"0123456789abcdef", 1_700_000_000, br#"{"a":1}"#);
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        mac.update(br#"1700000000.{"a":1}"#);
        let want: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(v, format!("t=1700000000,v1={want}"));
        assert_ne!(
            v,
            hmac_signature(b"0123456789abcdef", 1_700_000_001, br#"{"a":1}"#)
        );
    }
}
