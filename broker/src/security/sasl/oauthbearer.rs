//! SASL/OAUTHBEARER (RFC 7628) as Kafka's `OAuthBearerSaslServer`: the
//! client sends `n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A]*^A`;
//! a token that does not validate gets Kafka's JSON error challenge, and
//! the exchange fails on the client's `^A` acknowledgement with that JSON
//! as the message.
//!
//! Two validators, as in Kafka:
//! - without `sasl.oauthbearer.jwks.endpoint.url`, Kafka's default
//!   unsecured validator (`OAuthBearerUnsecuredValidatorCallbackHandler`):
//!   unsigned `alg: none` tokens, configured by the JAAS options
//!   `unsecuredValidator*`. It authenticates anyone who can write JSON and
//!   exists for development, as in Kafka;
//! - with it, Kafka's secured validator (`ValidatorAccessTokenValidator` over
//!   jose4j): signatures checked against the JWKS's asymmetric keys, then
//!   `exp`, `iat`, `nbf`, audience, issuer, subject and scope claims. The
//!   JWKS is a `file://` URL, read once, or an `http(s)://` one, fetched
//!   and refreshed as [`super::jwks`] describes.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, LazyLock};

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use regex::Regex;
use serde_json::Value;

use super::jaas::LoginModuleEntry;
use super::jwks::JwksEndpoint;
use super::{
    invalid_credentials, Authenticator, Mechanism, MechanismConfig, SaslConfigError, Settings,
    Step, SASL_JAAS_CONFIG, SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS,
    SASL_OAUTHBEARER_EXPECTED_AUDIENCE, SASL_OAUTHBEARER_EXPECTED_ISSUER,
    SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, SASL_OAUTHBEARER_SCOPE_CLAIM_NAME,
    SASL_OAUTHBEARER_SUB_CLAIM_NAME,
};

/// The client's answer to an error challenge (RFC 7628 section 3.2.3).
const CONTROL_A: u8 = 0x01;

/// JWT sections are base64url (RFC 7515); Kafka's unsecured validator
/// decodes them with Java's basic decoder, so the standard alphabet is
/// accepted too, with or without padding.
const BASE64_URL: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const BASE64_STANDARD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Kafka's `OAuthBearerClientInitialResponse` grammar.
static CLIENT_INITIAL_RESPONSE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^n,(?:a=(?P<authzid>(?:[\x01-\x7F&&[^=,]]|=2C|=3D)+))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7E \t\r\n]+\x01)*)\x01$",
    )
    .expect("client initial response pattern is valid")
});
static AUTH_VALUE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?P<scheme>[A-Za-z0-9_]+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)$")
        .expect("auth pattern is valid")
});
/// RFC 6749's scope-token characters, as Kafka's `OAuthBearerScopeUtils`.
static SCOPE_ITEM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\x23-\x5B\x5D-\x7E\x21]+$").expect("scope pattern is valid"));

/// How tokens are validated on this listener.
pub(super) enum Validator {
    Unsecured(UnsecuredValidator),
    Jwks(JwksValidator),
}

/// A token that validated.
#[derive(Debug, PartialEq, Eq)]
struct ValidToken {
    principal: String,
    /// `exp`, in epoch milliseconds.
    expires_ms: i64,
}

/// Why a token was refused, as the JSON error challenge reports it.
#[derive(Debug, PartialEq, Eq)]
struct TokenError {
    status: &'static str,
    scope: Option<String>,
}

impl TokenError {
    fn invalid_token() -> Self {
        Self {
            status: "invalid_token",
            scope: None,
        }
    }

    /// Kafka's `jsonErrorResponse`, byte for byte (including the space
    /// after each comma). Scope items cannot hold `"` or `\`, so nothing
    /// needs escaping; Kafka's validators never set `openid-configuration`.
    fn to_json(&self) -> String {
        match &self.scope {
            Some(scope) => format!(r#"{{"status":"{}", "scope":"{scope}"}}"#, self.status),
            None => format!(r#"{{"status":"{}"}}"#, self.status),
        }
    }
}

impl Validator {
    pub(super) fn from_config(
        jaas: Option<&LoginModuleEntry>,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SaslConfigError> {
        match get(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL).filter(|url| !url.trim().is_empty()) {
            Some(url) => Ok(Validator::Jwks(JwksValidator::from_config(
                url.trim(),
                jaas,
                get,
            )?)),
            None => Ok(Validator::Unsecured(UnsecuredValidator::from_jaas(jaas)?)),
        }
    }

    fn validate(&self, token: &str, now_ms: i64) -> Result<ValidToken, TokenError> {
        match self {
            Validator::Unsecured(v) => v.validate(token, now_ms),
            Validator::Jwks(v) => v.validate(token, now_ms),
        }
    }
}

/// Kafka's unsecured validator and its JAAS options.
pub(super) struct UnsecuredValidator {
    principal_claim: String,
    scope_claim: String,
    required_scope: Vec<String>,
    allowable_clock_skew_ms: i64,
}

impl UnsecuredValidator {
    fn from_jaas(jaas: Option<&LoginModuleEntry>) -> Result<Self, SaslConfigError> {
        let option = |key: &str| {
            jaas.and_then(|entry| entry.options.get(key))
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let config_error = |reason: String| SaslConfigError::new(SASL_JAAS_CONFIG, reason);
        let mut required_scope = Vec::new();
        for item in option("unsecuredValidatorRequiredScope")
            .unwrap_or_default()
            .split(' ')
            .filter(|item| !item.is_empty())
        {
            if !SCOPE_ITEM.is_match(item) {
                return Err(config_error(format!("Invalid scope value: {item}")));
            }
            required_scope.push(item.to_owned());
        }
        let allowable_clock_skew_ms = match option("unsecuredValidatorAllowableClockSkewMs") {
            None => 0,
            Some(text) => {
                let skew: i32 = text
                    .parse()
                    .map_err(|_| config_error(format!("For input string: \"{text}\"")))?;
                if skew < 0 {
                    return Err(config_error(format!(
                        "Allowable clock skew millis must not be negative: {text}"
                    )));
                }
                i64::from(skew)
            }
        };
        Ok(Self {
            principal_claim: option("unsecuredValidatorPrincipalClaimName")
                .unwrap_or_else(|| "sub".to_owned()),
            scope_claim: option("unsecuredValidatorScopeClaimName")
                .unwrap_or_else(|| "scope".to_owned()),
            required_scope,
            allowable_clock_skew_ms,
        })
    }

    /// Kafka's `OAuthBearerUnsecuredJws` followed by the checks of
    /// `OAuthBearerUnsecuredValidatorCallbackHandler`, in its order.
    fn validate(&self, token: &str, now_ms: i64) -> Result<ValidToken, TokenError> {
        let invalid = TokenError::invalid_token;
        if token.contains("..") {
            return Err(invalid());
        }
        let sections: Vec<&str> = token.split('.').collect();
        let [header, claims, signature] = sections[..] else {
            return Err(invalid());
        };
        let header = unsecured_claims(header).ok_or_else(invalid)?;
        let claims = unsecured_claims(claims).ok_or_else(invalid)?;
        if header.get("alg") != Some(&Claim::Text("none".to_owned())) || !signature.is_empty() {
            return Err(invalid());
        }
        let scope = match claims.get(&self.scope_claim) {
            None => HashSet::new(),
            Some(Claim::Text(text)) => match text.trim() {
                "" => HashSet::new(),
                // Kafka keeps a string scope whole, unsplit.
                trimmed => HashSet::from([trimmed.to_owned()]),
            },
            Some(Claim::List(items)) => items
                .iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(Claim::Number(_)) => return Err(invalid()),
        };
        let Some(Claim::Number(exp)) = claims.get("exp") else {
            return Err(invalid());
        };
        let expires_ms = seconds_to_ms(*exp);
        let principal = match claims.get(&self.principal_claim) {
            Some(Claim::Text(name)) if !name.trim().is_empty() => name.clone(),
            _ => return Err(invalid()),
        };
        let skew_ms = self.allowable_clock_skew_ms as f64;
        let iat = match claims.get("iat") {
            None => None,
            Some(Claim::Number(iat)) => Some(*iat),
            Some(_) => return Err(invalid()),
        };
        if iat.is_some_and(|iat| 1000.0 * iat > now_ms as f64 + skew_ms) {
            return Err(invalid());
        }
        if now_ms as f64 - skew_ms >= 1000.0 * exp {
            return Err(invalid());
        }
        if iat.is_some_and(|iat| *exp <= iat) {
            return Err(invalid());
        }
        if self.required_scope.iter().any(|s| !scope.contains(s)) {
            return Err(TokenError {
                status: "insufficient_scope",
                // Java's List.toString().
                scope: Some(format!("[{}]", self.required_scope.join(", "))),
            });
        }
        Ok(ValidToken {
            principal,
            expires_ms,
        })
    }
}

/// A claim as Kafka's unsecured JWS holds it: numbers stay numbers, arrays
/// become lists of their elements' text, anything else becomes its text
/// (Jackson's `asText`).
#[derive(Debug, PartialEq)]
enum Claim {
    Number(f64),
    List(Vec<String>),
    Text(String),
}

fn as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_owned(),
        Value::Array(_) | Value::Object(_) => String::new(),
    }
}

fn unsecured_claims(section: &str) -> Option<BTreeMap<String, Claim>> {
    let Value::Object(map) = json_section(section)? else {
        return None;
    };
    Some(
        map.into_iter()
            // Jackson would turn a null claim into the text "null" (so
            // `"sub": null` names a user "null"); here it is absent.
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| {
                let claim = match &value {
                    // Every JSON number has an f64 unless serde_json's
                    // arbitrary precision is on; then a number that has
                    // none is text, which no time check accepts.
                    Value::Number(n) => n
                        .as_f64()
                        .map_or_else(|| Claim::Text(n.to_string()), Claim::Number),
                    Value::Array(items) => Claim::List(items.iter().map(as_text).collect()),
                    other => Claim::Text(as_text(other)),
                };
                (key, claim)
            })
            .collect(),
    )
}

/// A base64url section holding JSON.
fn json_section(section: &str) -> Option<Value> {
    let bytes = BASE64_URL
        .decode(section)
        .or_else(|_| BASE64_STANDARD.decode(section))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Seconds (possibly fractional) to epoch milliseconds, rounded as Kafka
/// rounds them; out-of-range values saturate.
fn seconds_to_ms(seconds: f64) -> i64 {
    (seconds * 1000.0).round() as i64
}

/// Kafka's secured validator over a JWKS.
pub(super) struct JwksValidator {
    keys: KeySource,
    clock_skew_ms: i64,
    expected_audiences: Vec<String>,
    expected_issuer: Option<String>,
    sub_claim: String,
    scope_claim: String,
}

/// Where a validator's keys come from.
enum KeySource {
    /// A `file://` JWKS, read once when the configuration is built, as
    /// Kafka's `JwksFileVerificationKeyResolver` reads it once at startup.
    File(Arc<Vec<VerificationKey>>),
    /// An `http://` or `https://` JWKS, refreshed in the background.
    Endpoint(Arc<JwksEndpoint>),
}

impl KeySource {
    fn current(&self) -> Arc<Vec<VerificationKey>> {
        match self {
            KeySource::File(keys) => Arc::clone(keys),
            KeySource::Endpoint(endpoint) => endpoint.keys(),
        }
    }

    /// A token named a key id the set does not hold.
    fn key_missing(&self, kid: &str) {
        if let KeySource::Endpoint(endpoint) = self {
            endpoint.key_missing(kid);
        }
    }
}

/// A public key from the JWKS and the signature algorithms it may verify.
/// Only asymmetric algorithms are ever allowed, so a token "signed" with
/// HMAC keyed by public key bytes, or not signed at all, has no key.
pub(super) struct VerificationKey {
    pub(super) kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

impl JwksValidator {
    fn from_config(
        url: &str,
        jaas: Option<&LoginModuleEntry>,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, SaslConfigError> {
        let key = SASL_OAUTHBEARER_JWKS_ENDPOINT_URL;
        let error = |reason: String| SaslConfigError::new(key, reason);
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(error(format!(
                "The OAuth configuration option {key} contains a URL ({url}) that is missing the protocol"
            )));
        };
        let keys = match scheme.to_ascii_lowercase().as_str() {
            "file" => {
                let path = rest
                    .strip_prefix("//localhost")
                    .or_else(|| rest.strip_prefix("//"))
                    .unwrap_or(rest);
                if !path.starts_with('/') {
                    return Err(error(format!(
                        "The OAuth configuration option {key} contains a URL ({url}) that is malformed: expected file:///absolute/path"
                    )));
                }
                let text = std::fs::read_to_string(path).map_err(|e| {
                    error(format!(
                        "The OAuth configuration option {key} contains a file ({path}) that cannot be read: {e}"
                    ))
                })?;
                let keys =
                    parse_jwks(&text).map_err(|reason| error(format!("{path}: {reason}")))?;
                KeySource::File(Arc::new(keys))
            }
            "http" | "https" => {
                if !rest.starts_with("//") || rest.len() <= 2 {
                    return Err(error(format!(
                        "The OAuth configuration option {key} contains a URL ({url}) that is malformed"
                    )));
                }
                KeySource::Endpoint(JwksEndpoint::start(url, jaas, get)?)
            }
            other => {
                return Err(error(format!(
                    "The OAuth configuration option {key} contains a URL ({url}) that contains an invalid protocol ({other}); only \"http\", \"https\", and \"file\" protocol are supported"
                )))
            }
        };

        let clock_skew_seconds = match get(SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS) {
            None => 30,
            Some(text) => text
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|s| *s >= 0)
                .ok_or_else(|| {
                    SaslConfigError::new(
                        SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS,
                        format!("The OAuth configuration option {SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS} value must be an integer of at least 0, not {text:?}"),
                    )
                })?,
        };
        let expected_audiences = get(SASL_OAUTHBEARER_EXPECTED_AUDIENCE)
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect();
        let expected_issuer = get(SASL_OAUTHBEARER_EXPECTED_ISSUER)
            .map(|i| i.trim().to_owned())
            .filter(|i| !i.is_empty());
        let claim_name = |key: &str, default: &str| {
            match get(key) {
            None => Ok(default.to_owned()),
            Some(name) if !name.trim().is_empty() => Ok(name.trim().to_owned()),
            Some(_) => Err(SaslConfigError::new(
                key,
                format!("The OAuth configuration option {key} value must not be empty or only whitespace"),
            )),
        }
        };
        Ok(Self {
            keys,
            clock_skew_ms: i64::from(clock_skew_seconds) * 1000,
            expected_audiences,
            expected_issuer,
            sub_claim: claim_name(SASL_OAUTHBEARER_SUB_CLAIM_NAME, "sub")?,
            scope_claim: claim_name(SASL_OAUTHBEARER_SCOPE_CLAIM_NAME, "scope")?,
        })
    }

    /// Signature first (jose4j's order: no claim of an unverified token is
    /// looked at), then jose4j's claim checks, then Kafka's.
    fn validate(&self, token: &str, now_ms: i64) -> Result<ValidToken, TokenError> {
        let invalid = TokenError::invalid_token;
        let token = token.trim();
        let sections: Vec<&str> = token.split('.').collect();
        let [header, payload, signature] = sections[..] else {
            return Err(invalid());
        };
        if header.is_empty() || payload.is_empty() || signature.is_empty() {
            return Err(invalid());
        }
        // `alg: none` and unknown algorithms do not parse.
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid())?;
        let signed = &token[..header_and_payload_len(token)];
        let keys = self.keys.current();
        let verified = keys
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
            .filter(|k| header.kid.is_none() || k.kid == header.kid)
            .any(|k| {
                jsonwebtoken::crypto::verify(signature, signed.as_bytes(), &k.key, header.alg)
                    .unwrap_or(false)
            });
        if !verified {
            if let Some(kid) = &header.kid {
                if !keys.iter().any(|k| k.kid.as_ref() == Some(kid)) {
                    self.keys.key_missing(kid);
                }
            }
            return Err(invalid());
        }
        let Some(Value::Object(claims)) = json_section(payload) else {
            return Err(invalid());
        };

        let time_ms = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_f64().map(seconds_to_ms).map(Some).ok_or_else(invalid),
            Some(_) => Err(invalid()),
        };
        let expires_ms = time_ms("exp")?.ok_or_else(invalid)?;
        let issued_ms = time_ms("iat")?.ok_or_else(invalid)?;
        let not_before_ms = time_ms("nbf")?;
        let skew = self.clock_skew_ms;
        if now_ms.saturating_sub(skew) >= expires_ms
            || issued_ms > now_ms.saturating_add(skew)
            || not_before_ms.is_some_and(|nbf| nbf > now_ms.saturating_add(skew))
            || expires_ms < 0
            || issued_ms < 0
        {
            return Err(invalid());
        }

        // jose4j refuses a token with an audience when none is expected,
        // and one without an expected audience when some are.
        let audiences: Vec<&str> = match claims.get("aud") {
            None => Vec::new(),
            Some(Value::String(aud)) => vec![aud.as_str()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|a| a.as_str().ok_or_else(invalid))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid()),
        };
        let audience_ok = if self.expected_audiences.is_empty() {
            audiences.is_empty()
        } else {
            audiences
                .iter()
                .any(|a| self.expected_audiences.iter().any(|e| e == a))
        };
        if !audience_ok {
            return Err(invalid());
        }
        if let Some(expected) = &self.expected_issuer {
            if claims.get("iss").and_then(Value::as_str) != Some(expected.as_str()) {
                return Err(invalid());
            }
        }

        let principal = match claims.get(&self.sub_claim) {
            Some(Value::String(sub)) if !sub.trim().is_empty() => sub.trim().to_owned(),
            _ => return Err(invalid()),
        };
        // Kafka's `ClaimValidationUtils.validateScopes`: a string is one
        // scope; every scope non-blank, none repeated.
        let scopes: Vec<&Value> = match claims.get(&self.scope_claim) {
            Some(single @ Value::String(_)) => vec![single],
            Some(Value::Array(items)) => items.iter().collect(),
            _ => Vec::new(),
        };
        let mut seen = HashSet::new();
        for scope in scopes {
            let scope = scope.as_str().map(str::trim).unwrap_or("");
            if scope.is_empty() || !seen.insert(scope) {
                return Err(invalid());
            }
        }
        Ok(ValidToken {
            principal,
            expires_ms,
        })
    }
}

/// The length of `header.payload`, the part a JWS signature covers.
fn header_and_payload_len(token: &str) -> usize {
    token.rfind('.').unwrap_or(0)
}

/// The usable verification keys of a JWKS document. Keys this broker cannot
/// use for signatures (symmetric `oct` keys, encryption keys, P-521, X25519,
/// unknown types) are skipped, as a JWKS may well hold some; a JWKS with no
/// usable key at all is an error.
pub(super) fn parse_jwks(text: &str) -> Result<Vec<VerificationKey>, String> {
    let document: Value =
        serde_json::from_str(text).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
    let Some(Value::Array(entries)) = document.get("keys") else {
        return Err("not a JSON Web Key Set: no \"keys\" array".to_owned());
    };
    let keys: Vec<VerificationKey> = entries
        .iter()
        .filter_map(|entry| verification_key(serde_json::from_value(entry.clone()).ok()?))
        .collect();
    if keys.is_empty() {
        return Err(
            "the JSON Web Key Set has no RSA, EC (P-256, P-384) or Ed25519 signature key"
                .to_owned(),
        );
    }
    Ok(keys)
}

fn verification_key(jwk: Jwk) -> Option<VerificationKey> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return None;
    }
    let mut algorithms = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) => match p.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return None,
        },
        AlgorithmParameters::OctetKey(_) => return None,
    };
    // A key that names its algorithm verifies only that one.
    if let Some(declared) = jwk.common.key_algorithm {
        let declared = Algorithm::from_str(&format!("{declared:?}")).ok()?;
        algorithms.retain(|a| *a == declared);
    }
    if algorithms.is_empty() {
        return None;
    }
    Some(VerificationKey {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key: DecodingKey::from_jwk(&jwk).ok()?,
    })
}

/// The client's first message: the token, and the authorization id it asks for.
struct ClientInitialResponse {
    authzid: String,
    token: String,
}

/// Kafka's `OAuthBearerClientInitialResponse` parser; `None` is Kafka's
/// `SaslException` (the generic failure).
fn parse_client_initial_response(bytes: &[u8]) -> Option<ClientInitialResponse> {
    let message = std::str::from_utf8(bytes).ok()?;
    let parts = CLIENT_INITIAL_RESPONSE.captures(message)?;
    // Key-value pairs as a map: the last `auth` wins. Other keys are SASL
    // extensions, which Kafka's validators all accept and nothing here uses.
    let auth = parts
        .name("kvpairs")?
        .as_str()
        .split('\u{1}')
        .rev()
        .filter_map(|kv| kv.split_once('='))
        .find(|(key, _)| *key == "auth")?
        .1;
    let auth = AUTH_VALUE.captures(auth)?;
    if !auth.name("scheme")?.as_str().eq_ignore_ascii_case("bearer") {
        return None;
    }
    Some(ClientInitialResponse {
        authzid: parts.name("authzid").map_or(String::new(), |a| {
            a.as_str().replace("=2C", ",").replace("=3D", "=")
        }),
        token: auth.name("token")?.as_str().to_owned(),
    })
}

pub(super) struct OAuthBearerAuthenticator {
    cfg: Arc<MechanismConfig>,
    /// The JSON error challenge last sent, which the client acknowledges
    /// with `^A` before the exchange fails with it.
    error_sent: Option<String>,
    finished: bool,
}

impl OAuthBearerAuthenticator {
    pub(super) fn new(cfg: &Arc<MechanismConfig>) -> Self {
        Self {
            cfg: Arc::clone(cfg),
            error_sent: None,
            finished: false,
        }
    }

    fn fail(&mut self) -> Step {
        self.finished = true;
        invalid_credentials(Mechanism::OAuthBearer)
    }
}

impl Authenticator for OAuthBearerAuthenticator {
    fn step(&mut self, client_bytes: &[u8]) -> Step {
        if self.finished {
            return self.fail();
        }
        if client_bytes == [CONTROL_A] {
            if let Some(message) = self.error_sent.take() {
                self.finished = true;
                return Step::Failed { message };
            }
        }
        // As in Kafka, anything but the acknowledgement after an error
        // challenge is a new client first message.
        self.error_sent = None;
        let Some(response) = parse_client_initial_response(client_bytes) else {
            return self.fail();
        };
        let Settings::OAuthBearer(validator) = &self.cfg.settings else {
            return self.fail();
        };
        let now_ms = (self.cfg.clock)();
        let token = match validator.validate(&response.token, now_ms) {
            Ok(token) => token,
            Err(error) => {
                let json = error.to_json();
                self.error_sent = Some(json.clone());
                return Step::Challenge(json.into_bytes());
            }
        };
        self.finished = true;
        if !response.authzid.is_empty() && response.authzid != token.principal {
            return Step::Failed {
                message: format!(
                    "Authentication failed: Client requested an authorization id ({}) that is different from the token's principal name ({})",
                    response.authzid, token.principal
                ),
            };
        }
        Step::Done {
            principal: token.principal,
            response: Vec::new(),
            // Kafka's `zeroIfNegative`: a token accepted within the clock
            // skew after its expiry has no time left.
            lifetime_ms: Some(token.expires_ms.saturating_sub(now_ms).max(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::security::sasl::authenticator;
    use crate::security::sasl::tests::{generic_failure, no_credentials};

    const NOW_MS: i64 = 1_700_000_000_000;
    const NOW_S: i64 = NOW_MS / 1000;
    const INVALID_TOKEN: &str = r#"{"status":"invalid_token"}"#;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn unsecured_token(claims: &Value) -> String {
        format!(
            "{}.{}.",
            b64(br#"{"alg":"none"}"#),
            b64(claims.to_string().as_bytes())
        )
    }

    fn client_first(token: &str) -> Vec<u8> {
        format!("n,,\u{1}auth=Bearer {token}\u{1}\u{1}").into_bytes()
    }

    fn config(
        jaas: Option<&str>,
        settings: &[(&str, &str)],
    ) -> Result<Arc<MechanismConfig>, SaslConfigError> {
        let settings: HashMap<String, String> = settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let get = |key: &str| {
            if key == SASL_JAAS_CONFIG {
                jaas.map(str::to_owned)
            } else {
                settings.get(key).cloned()
            }
        };
        let cfg = MechanismConfig::from_config(Mechanism::OAuthBearer, &get)?;
        Ok(Arc::new(cfg.with_clock(Arc::new(|| NOW_MS))))
    }

    fn unsecured(jaas_options: &str) -> Arc<MechanismConfig> {
        config(
            Some(&format!(
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required {jaas_options};"
            )),
            &[],
        )
        .unwrap()
    }

    fn first_step(cfg: &Arc<MechanismConfig>, message: &[u8]) -> Step {
        authenticator(Mechanism::OAuthBearer, cfg, &no_credentials()).step(message)
    }

    fn done(principal: &str, lifetime_ms: i64) -> Step {
        Step::Done {
            principal: principal.to_owned(),
            response: Vec::new(),
            lifetime_ms: Some(lifetime_ms),
        }
    }

    fn challenge(json: &str) -> Step {
        Step::Challenge(json.as_bytes().to_vec())
    }

    /// The token is refused with `json`, and the exchange fails with it
    /// once the client acknowledges.
    fn assert_refused(cfg: &Arc<MechanismConfig>, token: &str, json: &str) {
        let mut auth = authenticator(Mechanism::OAuthBearer, cfg, &no_credentials());
        assert_eq!(auth.step(&client_first(token)), challenge(json), "{token}");
        assert_eq!(
            auth.step(b"\x01"),
            Step::Failed {
                message: json.to_owned()
            }
        );
        assert_eq!(auth.step(b"\x01"), generic_failure(Mechanism::OAuthBearer));
    }

    #[test]
    fn unsecured_token_authenticates_with_its_remaining_lifetime() {
        let cfg = unsecured("");
        let token = unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 3600, "iat": NOW_S}));
        assert_eq!(
            first_step(&cfg, &client_first(&token)),
            done("alice", 3_600_000)
        );
        // Without any JAAS configuration the defaults apply.
        let cfg = config(None, &[]).unwrap();
        assert_eq!(
            first_step(&cfg, &client_first(&token)),
            done("alice", 3_600_000)
        );
        // Fractional seconds and extensions are fine; the scheme is case-insensitive.
        let token = unsecured_token(&json!({"sub": "alice", "exp": NOW_S as f64 + 0.5}));
        let message = format!("n,a=alice,\u{1}auth=BEARER {token}\u{1}traceId=abc 1\u{1}\u{1}");
        assert_eq!(first_step(&cfg, message.as_bytes()), done("alice", 500));
    }

    #[test]
    fn unsecured_token_refusals() {
        let cfg = unsecured("");
        let header = b64(br#"{"alg":"none"}"#);
        let claims = b64(json!({"sub": "alice", "exp": NOW_S + 60})
            .to_string()
            .as_bytes());
        for token in [
            // Expired, or expiring now.
            unsecured_token(&json!({"sub": "alice", "exp": NOW_S - 1})),
            unsecured_token(&json!({"sub": "alice", "exp": NOW_S})),
            // No exp, or not a number.
            unsecured_token(&json!({"sub": "alice"})),
            unsecured_token(&json!({"sub": "alice", "exp": "soon"})),
            // Issued in the future; expiring before it was issued.
            unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60, "iat": NOW_S + 1})),
            unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60, "iat": "x"})),
            // No principal, a blank one, or one that is not text.
            unsecured_token(&json!({"exp": NOW_S + 60})),
            unsecured_token(&json!({"sub": "  ", "exp": NOW_S + 60})),
            unsecured_token(&json!({"sub": 7, "exp": NOW_S + 60})),
            unsecured_token(&json!({"sub": ["alice"], "exp": NOW_S + 60})),
            unsecured_token(&json!({"sub": null, "exp": NOW_S + 60})),
            // A numeric scope.
            unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60, "scope": 1})),
            // Signed, or claiming a real algorithm.
            format!("{header}.{claims}.c2ln"),
            format!("{}.{claims}.", b64(br#"{"alg":"HS256"}"#)),
            format!("{}.{claims}.", b64(br#"{"typ":"JWT"}"#)),
            // Malformed compact serializations.
            format!("{header}.{claims}"),
            format!("{header}.{claims}.."),
            format!("{header}..{claims}."),
            format!("{header}.{claims}.x.y"),
            format!("{header}.~~~~."),
            format!("{header}.{}.", b64(b"not json")),
            format!("{header}.{}.", b64(b"[1,2]")),
        ] {
            assert_refused(&cfg, &token, INVALID_TOKEN);
        }
    }

    #[test]
    fn unsecured_jaas_options() {
        let cfg = unsecured(
            r#"unsecuredValidatorPrincipalClaimName="email" unsecuredValidatorScopeClaimName="scp"
               unsecuredValidatorRequiredScope="read write" unsecuredValidatorAllowableClockSkewMs="5000""#,
        );
        let token = |scope: Value, exp: i64| {
            unsecured_token(
                &json!({"sub": "ignored", "email": "bob@example.com", "exp": exp, "scp": scope}),
            )
        };
        // Expired two seconds ago, within the five seconds of skew.
        assert_eq!(
            first_step(
                &cfg,
                &client_first(&token(json!(["write", "read", " "]), NOW_S - 2))
            ),
            done("bob@example.com", 0)
        );
        assert_refused(
            &cfg,
            &token(json!(["read"]), NOW_S + 60),
            r#"{"status":"insufficient_scope", "scope":"[read, write]"}"#,
        );
        // Kafka keeps a string scope whole.
        assert_refused(
            &cfg,
            &token(json!("read write"), NOW_S + 60),
            r#"{"status":"insufficient_scope", "scope":"[read, write]"}"#,
        );
        assert_refused(
            &cfg,
            &token(json!(["read", "write"]), NOW_S - 6),
            INVALID_TOKEN,
        );
    }

    #[test]
    fn unsecured_configuration_errors() {
        let module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required";
        for (options, reason) in [
            (
                r#"unsecuredValidatorAllowableClockSkewMs="-1""#,
                "Allowable clock skew millis must not be negative: -1",
            ),
            (
                r#"unsecuredValidatorAllowableClockSkewMs="soon""#,
                "For input string: \"soon\"",
            ),
            (
                r#"unsecuredValidatorRequiredScope="read \"quoted\"""#,
                "Invalid scope value: \"quoted\"",
            ),
        ] {
            let err = config(Some(&format!("{module} {options};")), &[]).unwrap_err();
            assert_eq!(err, SaslConfigError::new(SASL_JAAS_CONFIG, reason));
        }
        let err = config(Some(module), &[]).unwrap_err();
        assert_eq!(err.reason, "JAAS config entry not terminated by semi-colon");
    }

    #[test]
    fn authorization_id_must_be_the_principal() {
        let cfg = unsecured("");
        let token = unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60}));
        let message = format!("n,a=bob,\u{1}auth=Bearer {token}\u{1}\u{1}");
        assert_eq!(
            first_step(&cfg, message.as_bytes()),
            Step::Failed {
                message: "Authentication failed: Client requested an authorization id (bob) that is different from the token's principal name (alice)".to_owned()
            }
        );
    }

    #[test]
    fn malformed_client_first_messages() {
        let cfg = unsecured("");
        let token = unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60}));
        let mut huge = format!("n,,\u{1}auth=Bearer {token}").into_bytes();
        huge.resize(1 << 20, b'!');
        huge.extend_from_slice(b"\x01\x01");
        for message in [
            Vec::new(),
            b"\x01".to_vec(),
            b"n,,".to_vec(),
            b"n,,\x01\x01".to_vec(),
            format!("n,,\u{1}auth=Bearer {token}\u{1}").into_bytes(),
            format!("n,,\u{1}auth=Bearer {token}").into_bytes(),
            format!("y,,\u{1}auth=Bearer {token}\u{1}\u{1}").into_bytes(),
            format!("p=tls-unique,,\u{1}auth=Bearer {token}\u{1}\u{1}").into_bytes(),
            format!("n,,\u{1}auth=Basic {token}\u{1}\u{1}").into_bytes(),
            format!("n,,\u{1}auth=Bearer{token}\u{1}\u{1}").into_bytes(),
            format!("n,,\u{1}auth=Bearer {token}!\u{1}\u{1}").into_bytes(),
            format!("n,,\u{1}token=Bearer {token}\u{1}\u{1}").into_bytes(),
            format!("n,,\u{1}au th=Bearer {token}\u{1}\u{1}").into_bytes(),
            [
                format!("n,,\u{1}auth=Bearer {token}").as_bytes(),
                b"\xff\x01\x01",
            ]
            .concat(),
            huge,
        ] {
            let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
            assert_eq!(auth.step(&message), generic_failure(Mechanism::OAuthBearer));
            assert_eq!(
                auth.step(&client_first(&token)),
                generic_failure(Mechanism::OAuthBearer)
            );
        }
    }

    #[test]
    fn a_new_first_message_after_an_error_challenge_is_evaluated_as_kafka_does() {
        let cfg = unsecured("");
        let expired = unsecured_token(&json!({"sub": "alice", "exp": NOW_S - 60}));
        let valid = unsecured_token(&json!({"sub": "alice", "exp": NOW_S + 60}));
        let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
        assert_eq!(auth.step(&client_first(&expired)), challenge(INVALID_TOKEN));
        assert_eq!(auth.step(&client_first(&valid)), done("alice", 60_000));
    }

    /// An ES256 signer whose public half is published in a JWKS file.
    struct Signer {
        key: EncodingKey,
        public_raw: Vec<u8>,
        jwk: Value,
    }

    impl Signer {
        fn new(kid: &str) -> Self {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            // SEC1 uncompressed point: 0x04, x, y.
            let raw = pair.public_key_raw().to_vec();
            assert_eq!((raw.len(), raw[0]), (65, 4));
            Self {
                key: EncodingKey::from_ec_der(&pair.serialize_der()),
                jwk: json!({
                    "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                    "x": b64(&raw[1..33]), "y": b64(&raw[33..65]),
                }),
                public_raw: raw,
            }
        }

        fn sign(&self, kid: Option<&str>, claims: &Value) -> String {
            let header = Header {
                kid: kid.map(str::to_owned),
                ..Header::new(Algorithm::ES256)
            };
            jsonwebtoken::encode(&header, claims, &self.key).unwrap()
        }
    }

    fn jwks_file(keys: &[&Value]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let jwks = json!({"keys": keys});
        file.write_all(jwks.to_string().as_bytes()).unwrap();
        file
    }

    fn secured(
        file: &tempfile::NamedTempFile,
        extra: &[(&str, &str)],
    ) -> Result<Arc<MechanismConfig>, SaslConfigError> {
        let url = format!("file://{}", file.path().display());
        let mut settings = vec![(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, url.as_str())];
        settings.extend_from_slice(extra);
        config(None, &settings)
    }

    const AUDIENCE_AND_ISSUER: [(&str, &str); 2] = [
        (SASL_OAUTHBEARER_EXPECTED_AUDIENCE, "kafka, other"),
        (SASL_OAUTHBEARER_EXPECTED_ISSUER, "https://issuer.example"),
    ];

    fn claims(changes: Value) -> Value {
        let mut claims = json!({
            "sub": "alice", "iat": NOW_S, "exp": NOW_S + 600,
            "aud": ["kafka"], "iss": "https://issuer.example", "scope": ["produce", "consume"],
        });
        for (key, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(key);
            } else {
                claims[key] = value.clone();
            }
        }
        claims
    }

    #[test]
    fn jwks_signed_token_authenticates() {
        let signer = Signer::new("k1");
        let oct = json!({"kty": "oct", "k": b64(b"a shared secret"), "kid": "k1"});
        let file = jwks_file(&[&oct, &signer.jwk]);
        let cfg = secured(&file, &AUDIENCE_AND_ISSUER).unwrap();
        assert_eq!(
            first_step(
                &cfg,
                &client_first(&signer.sign(Some("k1"), &claims(json!({}))))
            ),
            done("alice", 600_000)
        );
        // No kid: every key that fits the algorithm is tried.
        assert_eq!(
            first_step(
                &cfg,
                &client_first(&signer.sign(None, &claims(json!({"aud": "other"}))))
            ),
            done("alice", 600_000)
        );
        // Within the default 30 s of clock skew.
        let skewed = claims(json!({"exp": NOW_S - 20, "iat": NOW_S + 20, "nbf": NOW_S + 20}));
        assert_eq!(
            first_step(&cfg, &client_first(&signer.sign(Some("k1"), &skewed))),
            done("alice", 0)
        );
        // A custom subject claim.
        let cfg = secured(
            &file,
            &[
                AUDIENCE_AND_ISSUER[0],
                AUDIENCE_AND_ISSUER[1],
                (SASL_OAUTHBEARER_SUB_CLAIM_NAME, "client_id"),
            ],
        )
        .unwrap();
        let token = signer.sign(Some("k1"), &claims(json!({"client_id": " svc "})));
        assert_eq!(
            first_step(&cfg, &client_first(&token)),
            done("svc", 600_000)
        );
    }

    #[test]
    fn jwks_refusals() {
        let signer = Signer::new("k1");
        let file = jwks_file(&[&signer.jwk]);
        let cfg = secured(&file, &AUDIENCE_AND_ISSUER).unwrap();
        let sign = |changes: Value| signer.sign(Some("k1"), &claims(changes));
        for (why, token) in [
            ("expired beyond the skew", sign(json!({"exp": NOW_S - 31}))),
            ("no exp", sign(json!({"exp": null}))),
            ("no iat", sign(json!({"iat": null}))),
            ("issued in the future", sign(json!({"iat": NOW_S + 31}))),
            ("not yet valid", sign(json!({"nbf": NOW_S + 31}))),
            ("negative iat", sign(json!({"iat": -1}))),
            ("wrong audience", sign(json!({"aud": ["somebody-else"]}))),
            ("no audience", sign(json!({"aud": null}))),
            ("wrong issuer", sign(json!({"iss": "https://evil.example"}))),
            ("no issuer", sign(json!({"iss": null}))),
            ("no subject", sign(json!({"sub": null}))),
            ("blank subject", sign(json!({"sub": " "}))),
            ("numeric subject", sign(json!({"sub": 42}))),
            ("duplicate scope", sign(json!({"scope": ["a", "a"]}))),
            ("blank scope", sign(json!({"scope": ["a", ""]}))),
            ("unknown kid", signer.sign(Some("k2"), &claims(json!({})))),
            (
                "another key's signature",
                Signer::new("k1").sign(Some("k1"), &claims(json!({}))),
            ),
        ] {
            let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
            assert_eq!(
                auth.step(&client_first(&token)),
                challenge(INVALID_TOKEN),
                "{why}"
            );
        }

        // A payload changed after signing.
        let token = sign(json!({}));
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = b64(claims(json!({"sub": "admin"})).to_string().as_bytes());
        parts[1] = &forged;
        assert_refused(&cfg, &parts.join("."), INVALID_TOKEN);
        // A truncated signature, or none.
        assert_refused(&cfg, &token[..token.len() - 4], INVALID_TOKEN);
        assert_refused(
            &cfg,
            &format!("{}.", &token[..token.rfind('.').unwrap()]),
            INVALID_TOKEN,
        );

        // Without an expected audience, jose4j refuses tokens that name one.
        let no_audience = secured(&file, &[AUDIENCE_AND_ISSUER[1]]).unwrap();
        assert_refused(&no_audience, &sign(json!({})), INVALID_TOKEN);
        assert_eq!(
            first_step(&no_audience, &client_first(&sign(json!({"aud": null})))),
            done("alice", 600_000)
        );
    }

    #[test]
    fn jwks_alg_confusion() {
        let signer = Signer::new("k1");
        let file = jwks_file(&[&signer.jwk]);
        let cfg = secured(&file, &AUDIENCE_AND_ISSUER).unwrap();
        // An unsigned token.
        assert_refused(&cfg, &unsecured_token(&claims(json!({}))), INVALID_TOKEN);
        // HMAC keyed with what is public: the raw point or the JWK's text.
        for secret in [
            signer.public_raw.clone(),
            signer.jwk.to_string().into_bytes(),
        ] {
            let header = Header {
                kid: Some("k1".to_owned()),
                ..Header::new(Algorithm::HS256)
            };
            let token = jsonwebtoken::encode(
                &header,
                &claims(json!({})),
                &EncodingKey::from_secret(&secret),
            )
            .unwrap();
            assert_refused(&cfg, &token, INVALID_TOKEN);
        }
        // The unsecured validator, in turn, refuses signed tokens.
        assert_refused(
            &unsecured(""),
            &signer.sign(Some("k1"), &claims(json!({}))),
            INVALID_TOKEN,
        );
    }

    #[test]
    fn jwks_configuration_errors() {
        let signer = Signer::new("k1");
        let good = jwks_file(&[&signer.jwk]);
        let url_error =
            |url: &str| config(None, &[(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, url)]).unwrap_err();
        for url in [
            // Nothing listens on port 1: a JWKS that cannot be fetched
            // stops the broker at start, as in Kafka.
            "https://127.0.0.1:1/jwks",
            "http://127.0.0.1:1/jwks",
            "http:/no-authority",
            "ftp://idp.example/jwks",
            "no-protocol",
            "file:relative/path",
            "file:///nonexistent/jwks.json",
        ] {
            let err = url_error(url);
            assert_eq!(err.key, SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, "{url}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        assert!(url_error("http://127.0.0.1:1/jwks")
            .reason
            .starts_with("Could not refresh JWKS from http://127.0.0.1:1/jwks: "));

        let not_json = {
            let mut file = tempfile::NamedTempFile::new().unwrap();
            file.write_all(b"{").unwrap();
            file
        };
        let only_symmetric = jwks_file(&[&json!({"kty": "oct", "k": b64(b"secret")})]);
        let encryption_only = jwks_file(&[&json!({
            "kty": "EC", "crv": "P-256", "use": "enc",
            "x": signer.jwk["x"], "y": signer.jwk["y"],
        })]);
        for file in [&not_json, &only_symmetric, &encryption_only] {
            assert_eq!(
                secured(file, &[]).unwrap_err().key,
                SASL_OAUTHBEARER_JWKS_ENDPOINT_URL
            );
        }

        for (key, value) in [
            (SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS, "-1"),
            (SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS, "thirty"),
            (SASL_OAUTHBEARER_SUB_CLAIM_NAME, " "),
            (SASL_OAUTHBEARER_SCOPE_CLAIM_NAME, ""),
        ] {
            assert_eq!(secured(&good, &[(key, value)]).unwrap_err().key, key);
        }
        // file://localhost/ is the same file.
        let url = format!("file://localhost{}", good.path().display());
        assert!(config(None, &[(SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, &url)]).is_ok());
    }

    #[test]
    fn jwks_clock_skew_setting() {
        let signer = Signer::new("k1");
        let file = jwks_file(&[&signer.jwk]);
        let strict = secured(
            &file,
            &[
                AUDIENCE_AND_ISSUER[0],
                AUDIENCE_AND_ISSUER[1],
                (SASL_OAUTHBEARER_CLOCK_SKEW_SECONDS, "0"),
            ],
        )
        .unwrap();
        assert_refused(
            &strict,
            &signer.sign(Some("k1"), &claims(json!({"exp": NOW_S}))),
            INVALID_TOKEN,
        );
        assert_eq!(
            first_step(
                &strict,
                &client_first(&signer.sign(Some("k1"), &claims(json!({"exp": NOW_S + 1}))))
            ),
            done("alice", 1000)
        );
    }

    /// A JWKS server on loopback for the endpoint tests: serves `jwks`
    /// (which the test may change) to every GET, over TLS when given a
    /// server config, and counts the requests.
    struct JwksServer {
        url: String,
        jwks: Arc<std::sync::Mutex<String>>,
        requests: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl JwksServer {
        fn start(jwks: &Value, tls: Option<Arc<rustls::ServerConfig>>) -> Self {
            use std::io::{BufRead as _, BufReader};
            use std::sync::atomic::Ordering;

            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = format!("{scheme}://{}/jwks", listener.local_addr().unwrap());
            let body = Arc::new(std::sync::Mutex::new(jwks.to_string()));
            let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let (served, count) = (Arc::clone(&body), Arc::clone(&requests));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let mut stream: Box<dyn ReadWrite> = match &tls {
                        Some(config) => {
                            let conn = rustls::ServerConnection::new(Arc::clone(config)).unwrap();
                            Box::new(rustls::StreamOwned::new(conn, stream))
                        }
                        None => Box::new(stream),
                    };
                    // Reads the request head, then answers on the same stream.
                    let mut reader = BufReader::new(&mut stream);
                    let mut line = String::new();
                    let mut ok = false;
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        if line == "\r\n" {
                            ok = true;
                            break;
                        }
                        line.clear();
                    }
                    drop(reader);
                    if !ok {
                        continue;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = served.lock().unwrap().clone();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes());
                    let _ = stream.flush();
                }
            });
            Self {
                url,
                jwks: body,
                requests,
            }
        }

        fn requests(&self) -> usize {
            self.requests.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    trait ReadWrite: std::io::Read + std::io::Write + Send {}
    impl<T: std::io::Read + std::io::Write + Send> ReadWrite for T {}

    fn endpoint_config(
        url: &str,
        jaas: Option<&str>,
    ) -> Result<Arc<MechanismConfig>, SaslConfigError> {
        config(
            jaas,
            &[
                (SASL_OAUTHBEARER_JWKS_ENDPOINT_URL, url),
                AUDIENCE_AND_ISSUER[0],
                AUDIENCE_AND_ISSUER[1],
            ],
        )
    }

    #[test]
    fn jwks_over_http_authenticates_and_picks_up_a_rotated_key() {
        let old = Signer::new("old");
        let server = JwksServer::start(&json!({"keys": [old.jwk]}), None);
        let cfg = endpoint_config(&server.url, None).unwrap();
        assert_eq!(server.requests(), 1, "fetched once at start");
        let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
        let token = old.sign(Some("old"), &claims(json!({})));
        assert_eq!(auth.step(&client_first(&token)), done("alice", 600_000));

        // The provider rotates to a new key. A token signed with it fails
        // at first (authentication never waits on the network) and asks
        // for a refresh, after which it authenticates.
        let new = Signer::new("new");
        *server.jwks.lock().unwrap() = json!({"keys": [new.jwk]}).to_string();
        let token = new.sign(Some("new"), &claims(json!({})));
        assert_refused(&cfg, &token, INVALID_TOKEN);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
            if auth.step(&client_first(&token)) == done("alice", 600_000) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the rotated key was never fetched"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The old key is gone with the refresh (and asking for it again
        // fetches once more: 3 requests so far).
        assert_refused(
            &cfg,
            &old.sign(Some("old"), &claims(json!({}))),
            INVALID_TOKEN,
        );
        while server.requests() < 3 {
            assert!(Instant::now() < deadline, "no refresh for the old key id");
            std::thread::sleep(Duration::from_millis(20));
        }

        // An unknown key id asks for a refresh once a minute, not per token.
        let before = server.requests();
        assert_eq!(before, 3);
        let stranger = Signer::new("stranger");
        for _ in 0..20 {
            assert_refused(
                &cfg,
                &stranger.sign(Some("stranger"), &claims(json!({}))),
                INVALID_TOKEN,
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(server.requests(), before + 1);
    }

    #[test]
    fn jwks_over_https_trusts_the_jaas_truststore() {
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into()),
            )
            .unwrap();
        let signer = Signer::new("k1");
        let server = JwksServer::start(
            &json!({"keys": [signer.jwk]}),
            Some(Arc::new(server_config)),
        );
        let mut truststore = tempfile::NamedTempFile::new().unwrap();
        truststore.write_all(cert.cert.pem().as_bytes()).unwrap();
        let jaas = format!(
            r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ssl.truststore.type="PEM" ssl.truststore.location="{}";"#,
            truststore.path().display()
        );
        let cfg = endpoint_config(&server.url, Some(&jaas)).unwrap();
        let mut auth = authenticator(Mechanism::OAuthBearer, &cfg, &no_credentials());
        let token = signer.sign(Some("k1"), &claims(json!({})));
        assert_eq!(auth.step(&client_first(&token)), done("alice", 600_000));

        // Without the truststore the self-signed endpoint is not trusted,
        // and the broker does not start.
        let err = endpoint_config(&server.url, None).unwrap_err();
        assert_eq!(err.key, SASL_OAUTHBEARER_JWKS_ENDPOINT_URL);
        assert!(err.reason.starts_with("Could not refresh JWKS"), "{err}");
    }
}
