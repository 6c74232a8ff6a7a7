//! Who is calling (authentication) and what they may do with a queue
//! (authorization), for the HTTP and gRPC APIs alike: both hand
//! [`Access::check`] the request's `authorization` header and the queue and
//! [`Action`] of the route, and map a [`Denied`] to their own status (401 or
//! 403; UNAUTHENTICATED or PERMISSION_DENIED).
//!
//! A bearer token is looked up by its SHA-256 (the configuration holds only
//! hashes), one hash and one map lookup per request. A token that is a JWT
//! and not a configured token is verified against the JWKS once and cached
//! until it expires.
//!
//! Invariant: this module knows nothing of HTTP or gRPC beyond the value of
//! an `authorization` header.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use sha2::{Digest as _, Sha256};

use crate::config::{AuthConfig, JwtConfig};

/// What a request does to a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Enqueue messages.
    Produce,
    /// Receive, ack, nack, extend.
    Receive,
    /// Pause, resume, skip a parked key, start or control a redrive.
    Admin,
    /// Read the queue's state (stats, parked keys, redrive status, a
    /// message's trace): any of the three grants.
    Read,
}

/// The name a caller authenticated as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub Arc<str>);

impl Principal {
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No credential, or one that is not valid (401, UNAUTHENTICATED).
    Unauthenticated(String),
    /// A valid caller not allowed this action on this queue (403,
    /// PERMISSION_DENIED).
    Forbidden(String),
}

impl Denied {
    pub fn message(&self) -> &str {
        match self {
            Denied::Unauthenticated(m) | Denied::Forbidden(m) => m,
        }
    }
}

/// The `WWW-Authenticate` value of a 401.
pub const WWW_AUTHENTICATE: &str = "Bearer realm=\"dispatcher\"";

/// The most JWTs kept verified at once; the cache is emptied when full.
const JWT_CACHE_ENTRIES: usize = 10_000;

/// The principals granted each action on one queue (`*`: any caller).
#[derive(Debug, Default, Clone)]
struct Grants {
    produce: HashSet<String>,
    receive: HashSet<String>,
    admin: HashSet<String>,
}

impl Grants {
    fn set(&self, action: Action) -> [&HashSet<String>; 3] {
        match action {
            Action::Produce => [&self.produce; 3],
            Action::Receive => [&self.receive; 3],
            Action::Admin => [&self.admin; 3],
            Action::Read => [&self.produce, &self.receive, &self.admin],
        }
    }

    fn allows(&self, principal: &str, action: Action) -> bool {
        self.set(action)
            .iter()
            .any(|s| s.contains(principal) || s.contains("*"))
    }
}

/// The authentication and authorization of an instance's public APIs.
pub struct Access {
    /// SHA-256 of a token → its principal.
    tokens: HashMap<[u8; 32], Principal>,
    jwt: Option<JwtVerifier>,
    /// Queue name (or `*`, every queue) → grants.
    grants: HashMap<String, Grants>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("tokens", &self.tokens.len())
            .field("jwt", &self.jwt.is_some())
            .field("queues", &self.grants.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Access {
    pub fn new(config: &AuthConfig) -> anyhow::Result<Access> {
        let tokens = config
            .tokens
            .iter()
            .map(|t| (t.sha256, Principal(Arc::from(t.principal.as_str()))))
            .collect();
        let jwt = config.jwt.as_ref().map(JwtVerifier::new).transpose()?;
        let mut grants: HashMap<String, Grants> = HashMap::new();
        for g in &config.queues {
            let e = grants.entry(g.queue.clone()).or_default();
            e.produce.extend(g.produce.iter().cloned());
            e.receive.extend(g.receive.iter().cloned());
            e.admin.extend(g.admin.iter().cloned());
        }
        Ok(Access {
            tokens,
            jwt,
            grants,
        })
    }

    /// The caller of a request with this `authorization` header value.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, Denied> {
        let Some(value) = authorization else {
            return Err(Denied::Unauthenticated(
                "no credential: send \"authorization: Bearer <token>\"".into(),
            ));
        };
        let token = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .ok_or_else(|| {
                Denied::Unauthenticated("the authorization header is not \"Bearer <token>\"".into())
            })?;
        let token = token.trim_ascii();
        let digest: [u8; 32] = Sha256::digest(token).into();
        if let Some(p) = self.tokens.get(&digest) {
            return Ok(p.clone());
        }
        if let (Some(jwt), Ok(text)) = (&self.jwt, std::str::from_utf8(token)) {
            if text.split('.').count() == 3 {
                return jwt.verify(text, digest);
            }
        }
        Err(Denied::Unauthenticated("the token is not valid".into()))
    }

    /// Whether `principal` may do `action` on `queue`: a grant of the queue
    /// or of `*` names it (or `*`).
    pub fn allows(&self, principal: &Principal, queue: &str, action: Action) -> bool {
        [queue, "*"].iter().any(|q| {
            self.grants
                .get(*q)
                .is_some_and(|g| g.allows(principal.name(), action))
        })
    }

    /// Authenticates, then authorizes `action` on `queue` (when the request
    /// names one; otherwise any authenticated caller passes).
    pub fn check(
        &self,
        authorization: Option<&[u8]>,
        queue: Option<&str>,
        action: Action,
    ) -> Result<Principal, Denied> {
        let principal = self.authenticate(authorization)?;
        if let Some(queue) = queue {
            if !self.allows(&principal, queue, action) {
                return Err(Denied::Forbidden(format!(
                    "{:?} may not {} queue {queue:?}",
                    principal.name(),
                    match action {
                        Action::Produce => "produce to",
                        Action::Receive => "receive from",
                        Action::Admin => "administer",
                        Action::Read => "read",
                    }
                )));
            }
        }
        Ok(principal)
    }
}

/// Caller JWTs checked against the keys of a JWKS (signature, `exp`,
/// `nbf`, and the issuer and audience when configured).
struct JwtVerifier {
    keys: HashMap<String, (jsonwebtoken::DecodingKey, jsonwebtoken::Algorithm)>,
    /// Used for a token whose header names no `kid`, when the set has one key.
    only: Option<String>,
    issuer: Option<String>,
    audience: Option<String>,
    principal_claim: String,
    /// SHA-256 of a verified token → its principal and `exp` (s).
    verified: Mutex<HashMap<[u8; 32], (Principal, u64)>>,
}

impl JwtVerifier {
    fn new(config: &JwtConfig) -> anyhow::Result<JwtVerifier> {
        let text = std::fs::read_to_string(&config.jwks_file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", config.jwks_file.display()))?;
        let set: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a JWKS: {e}", config.jwks_file.display()))?;
        let mut keys = HashMap::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let kid = jwk.common.key_id.clone().unwrap_or_else(|| i.to_string());
            let alg = match (&jwk.common.key_algorithm, &jwk.algorithm) {
                (Some(a), _) => a.to_string().parse::<jsonwebtoken::Algorithm>().ok(),
                (None, jsonwebtoken::jwk::AlgorithmParameters::RSA(_)) => {
                    Some(jsonwebtoken::Algorithm::RS256)
                }
                (None, jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_)) => {
                    Some(jsonwebtoken::Algorithm::ES256)
                }
                (None, _) => None,
            };
            let Some(alg) = alg else {
                anyhow::bail!(
                    "{}: key {kid:?}: no \"alg\" and not an RSA or EC key",
                    config.jwks_file.display()
                );
            };
            let key = jsonwebtoken::DecodingKey::from_jwk(jwk)
                .map_err(|e| anyhow::anyhow!("{}: key {kid:?}: {e}", config.jwks_file.display()))?;
            keys.insert(kid, (key, alg));
        }
        let only = (keys.len() == 1)
            .then(|| keys.keys().next().cloned())
            .flatten();
        Ok(JwtVerifier {
            keys,
            only,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            principal_claim: config.principal_claim.clone(),
            verified: Mutex::new(HashMap::new()),
        })
    }

    fn verify(&self, token: &str, digest: [u8; 32]) -> Result<Principal, Denied> {
        let now = jsonwebtoken::get_current_timestamp();
        {
            let cache = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((p, exp)) = cache.get(&digest) {
                if *exp > now {
                    return Ok(p.clone());
                }
            }
        }
        let invalid = |why: String| Denied::Unauthenticated(format!("the JWT is not valid: {why}"));
        let header = jsonwebtoken::decode_header(token).map_err(|e| invalid(e.to_string()))?;
        let kid = header.kid.clone().or_else(|| self.only.clone());
        let (key, alg) = kid
            .as_ref()
            .and_then(|k| self.keys.get(k))
            .ok_or_else(|| invalid(format!("no key {kid:?} in the JWKS")))?;
        if header.alg != *alg {
            return Err(invalid(format!(
                "signed with {:?}, the key is for {alg:?}",
                header.alg
            )));
        }
        let mut validation = jsonwebtoken::Validation::new(*alg);
        validation.set_required_spec_claims(&["exp"]);
        match &self.issuer {
            Some(iss) => validation.set_issuer(&[iss]),
            None => validation.iss = None,
        }
        match &self.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            key,
            &validation,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let name = data
            .claims
            .get(&self.principal_claim)
            .and_then(|v| v.as_str())
            .ok_or_else(|| invalid(format!("no string claim {:?}", self.principal_claim)))?;
        let exp = data
            .claims
            .get("exp")
            .and_then(|v| v.as_u64())
            .unwrap_or(now);
        let principal = Principal(Arc::from(name));
        let mut cache = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= JWT_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(digest, (principal.clone(), exp));
        Ok(principal)
    }
}

/// The lowercase hex SHA-256 of a token, as the configuration holds it
/// (`printf %s "$TOKEN" | sha256sum`).
pub fn token_sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares two secrets in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{QueueGrant, TokenHash};
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;

    /// An ES256 key, its JWKS file, and an `[auth]` trusting it for issuer
    /// `idp` and audience `dispatcher`; `w` may receive from `jobs`.
    fn jwt_access(dir: &std::path::Path) -> (Access, jsonwebtoken::EncodingKey) {
        let key = rcgen::KeyPair::generate().unwrap();
        let raw = key.public_key_raw(); // 0x04 || x || y
        let jwks = serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "k1", "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
        }]});
        let jwks_file = dir.join("jwks.json");
        std::fs::write(&jwks_file, jwks.to_string()).unwrap();
        let config = AuthConfig {
            tokens: vec![TokenHash {
                principal: "static".into(),
                sha256: Sha256::digest(b"static-token").into(),
            }],
            jwt: Some(JwtConfig {
                jwks_file,
                issuer: Some("idp".into()),
                audience: Some("dispatcher".into()),
                principal_claim: "sub".into(),
            }),
            queues: vec![QueueGrant {
                queue: "jobs".into(),
                produce: vec![],
                receive: vec!["w".into()],
                admin: vec![],
            }],
        };
        let signing =
            jsonwebtoken::EncodingKey::from_ec_pem(key.serialize_pem().as_bytes()).unwrap();
        (Access::new(&config).unwrap(), signing)
    }

    fn jwt(key: &jsonwebtoken::EncodingKey, claims: serde_json::Value) -> Vec<u8> {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("k1".into());
        format!(
            "Bearer {}",
            jsonwebtoken::encode(&header, &claims, key).unwrap()
        )
        .into_bytes()
    }

    #[test]
    fn tokens_and_jwks_jwts_authenticate_and_grants_authorize() {
        let dir = tempfile::tempdir().unwrap();
        let (access, key) = jwt_access(dir.path());
        let now = jsonwebtoken::get_current_timestamp();
        let good = jwt(
            &key,
            serde_json::json!({"sub": "w", "iss": "idp", "aud": "dispatcher", "exp": now + 60}),
        );
        let p = access
            .check(Some(&good), Some("jobs"), Action::Receive)
            .unwrap();
        assert_eq!(p.name(), "w");
        // Verified once, then from the cache.
        assert_eq!(
            access.jwt.as_ref().unwrap().verified.lock().unwrap().len(),
            1
        );
        assert_eq!(access.authenticate(Some(&good)).unwrap().name(), "w");
        assert!(matches!(
            access.check(Some(&good), Some("jobs"), Action::Produce),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            access.check(Some(&good), Some("other"), Action::Read),
            Err(Denied::Forbidden(_))
        ));
        assert_eq!(
            access
                .authenticate(Some(b"Bearer static-token"))
                .unwrap()
                .name(),
            "static"
        );
        for bad in [
            serde_json::json!({"sub": "w", "iss": "idp", "aud": "elsewhere", "exp": now + 60}),
            serde_json::json!({"sub": "w", "iss": "other", "aud": "dispatcher", "exp": now + 60}),
            serde_json::json!({"sub": "w", "iss": "idp", "aud": "dispatcher", "exp": now - 3600}),
            serde_json::json!({"iss": "idp", "aud": "dispatcher", "exp": now + 60}),
        ] {
            let token = jwt(&key, bad.clone());
            assert!(
                matches!(
                    access.authenticate(Some(&token)),
                    Err(Denied::Unauthenticated(_))
                ),
                "{bad}"
            );
        }
        // Signed by another key.
        let (_, other) = jwt_access(tempfile::tempdir().unwrap().path());
        let forged = jwt(
            &other,
            serde_json::json!({"sub": "w", "iss": "idp", "aud": "dispatcher", "exp": now + 60}),
        );
        assert!(matches!(
            access.authenticate(Some(&forged)),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            access.authenticate(None),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            access.authenticate(Some(b"Basic abc")),
            Err(Denied::Unauthenticated(_))
        ));
    }
}
