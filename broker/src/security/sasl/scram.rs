//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's
//! `ScramSaslServer`: client-first, server-first, client-final,
//! server-final, with Kafka's message grammar (`ScramMessages`) and
//! credential format (`ScramFormatter`). No channel binding: the GS2 flag
//! must be `n` or `y`. Delegation tokens (`tokenauth=true`) are refused,
//! as this broker has none.
//!
//! An unknown user gets a credential derived from a per-configuration
//! secret and the user name, so the exchange looks the same (a stable salt,
//! the usual iteration count) and fails only at the proof, with the same
//! message as a wrong password.

use std::sync::{Arc, LazyLock};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use regex::Regex;
use sha2::{Digest, Sha256, Sha512};

use super::{
    constant_time_eq, invalid_credentials, Authenticator, CredentialSource, Mechanism,
    MechanismConfig, SaslConfigError, Settings, Step,
};

/// A SCRAM mechanism, with the type id Kafka uses on the wire
/// (AlterUserScramCredentials, DescribeUserScramCredentials) and in its
/// metadata records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    /// Kafka's lower bound on a credential's iterations, for both hashes.
    pub const MIN_ITERATIONS: i32 = 4096;
    /// Kafka's upper bound on a credential's iterations, for both hashes.
    pub const MAX_ITERATIONS: i32 = 16384;

    /// Kafka's wire type: SCRAM-SHA-256 = 1, SCRAM-SHA-512 = 2.
    pub fn type_id(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_type_id(id: i8) -> Option<Self> {
        match id {
            1 => Some(ScramMechanism::Sha256),
            2 => Some(ScramMechanism::Sha512),
            _ => None,
        }
    }

    pub fn mechanism(self) -> Mechanism {
        match self {
            ScramMechanism::Sha256 => Mechanism::ScramSha256,
            ScramMechanism::Sha512 => Mechanism::ScramSha512,
        }
    }

    /// The hash's output length, which is also the proof's.
    pub(super) fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    pub(super) fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    pub(super) fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        const ANY_KEY: &str = "HMAC takes keys of any length";
        match self {
            ScramMechanism::Sha256 => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect(ANY_KEY);
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut mac = Hmac::<Sha512>::new_from_slice(key).expect(ANY_KEY);
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    /// RFC 5802's Hi(): PBKDF2 with this HMAC and one block of output.
    pub(super) fn hi(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0; self.hash_len()];
        match self {
            ScramMechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out)
            }
            ScramMechanism::Sha512 => {
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out)
            }
        }
        out
    }
}

/// What the server stores for a SCRAM user (Kafka's `ScramCredential`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

impl std::fmt::Debug for ScramCredential {
    /// The keys are password equivalents for a dictionary attack: not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential for `password` (UTF-8, not SASLprep-normalised, as
    /// Kafka's `ScramFormatter` does). An iteration count below 1 hashes
    /// once; bounds are the caller's to check (see
    /// [`ScramMechanism::MIN_ITERATIONS`]).
    pub fn from_password(
        mech: ScramMechanism,
        password: &str,
        salt: &[u8],
        iterations: i32,
    ) -> Self {
        let rounds = u32::try_from(iterations).unwrap_or(0).max(1);
        let salted_password = mech.hi(password.as_bytes(), salt, rounds);
        Self::from_salted_password(mech, &salted_password, salt, iterations)
    }

    /// The credential for an already salted password, which is what
    /// AlterUserScramCredentials carries.
    pub fn from_salted_password(
        mech: ScramMechanism,
        salted_password: &[u8],
        salt: &[u8],
        iterations: i32,
    ) -> Self {
        let client_key = mech.hmac(salted_password, b"Client Key");
        Self {
            salt: salt.to_vec(),
            stored_key: mech.hash(&client_key),
            server_key: mech.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }
}

/// SCRAM's per-configuration state: the secret unknown users' stand-in
/// credentials are derived from.
pub(super) struct ScramSettings {
    fake_credential_key: [u8; 32],
}

impl ScramSettings {
    pub(super) fn new() -> Result<Self, SaslConfigError> {
        let mut fake_credential_key = [0; 32];
        getrandom::fill(&mut fake_credential_key).map_err(|e| {
            SaslConfigError::new(
                "sasl.enabled.mechanisms",
                format!("SCRAM needs the system's random number generator: {e}"),
            )
        })?;
        Ok(Self {
            fake_credential_key,
        })
    }

    /// A stable stand-in credential for a user that does not exist. Its
    /// salt looks like the 26 base-36 characters Kafka's tools generate,
    /// and the iteration count is their default, so that the server-first
    /// message does not give the user away.
    fn fake_credential(&self, mech: ScramMechanism, user: &str) -> ScramCredential {
        let derive = |label: &[u8]| {
            let mut input = label.to_vec();
            input.extend_from_slice(&mech.type_id().to_be_bytes());
            input.extend_from_slice(user.as_bytes());
            ScramMechanism::Sha256.hmac(&self.fake_credential_key, &input)
        };
        const BASE36: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
        let salt = derive(b"salt")
            .iter()
            .take(26)
            .map(|b| BASE36[usize::from(*b) % BASE36.len()])
            .collect::<Vec<_>>();
        ScramCredential::from_salted_password(
            mech,
            &derive(b"salted password"),
            &salt,
            ScramMechanism::MIN_ITERATIONS,
        )
    }
}

// Kafka's `ScramMessages` grammar. Rust's regex supports the same class
// intersections as Java's.
const SASLNAME: &str = r"(?:[\x01-\x7F&&[^=,]]|=2C|=3D)+";
const VALUE: &str = r"[\x01-\x7F&&[^,]]+";
const PRINTABLE: &str = r"[\x21-\x7E&&[^,]]+";
const BASE64_RE: &str = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?";

/// `gs2-header [reserved-mext ","] username "," nonce ["," extensions]`,
/// with the GS2 flag `n` (client does not support channel binding) or `y`
/// (client does, but thinks the server does not); `p=` is refused.
static CLIENT_FIRST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        "^(?P<gs2>[ny],(?:a=(?P<authzid>{SASLNAME}))?,)\
         (?P<bare>(?:m={VALUE},)?n=(?P<saslname>{SASLNAME}),r=(?P<nonce>{PRINTABLE})\
         (?P<extensions>(?:,[A-Za-z]+={VALUE})*))$"
    ))
    .expect("client-first pattern is valid")
});

/// `channel-binding "," nonce ["," extensions] "," proof`.
static CLIENT_FINAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        "^(?P<without_proof>c=(?P<channel>{BASE64_RE}),r=(?P<nonce>{PRINTABLE})\
         (?:,[A-Za-z]+={VALUE})*),p=(?P<proof>{BASE64_RE})$"
    ))
    .expect("client-final pattern is valid")
});

/// Kafka's `ScramLoginModule.TOKEN_AUTH_CONFIG` extension.
const TOKEN_AUTH: &str = "tokenauth";

pub(super) struct ScramAuthenticator {
    mechanism: ScramMechanism,
    cfg: Arc<MechanismConfig>,
    creds: Arc<dyn CredentialSource>,
    state: State,
    /// Tests fix the server's nonce to replay RFC 7677's example.
    fixed_server_nonce: Option<String>,
}

enum State {
    ReceiveClientFirst,
    ReceiveClientFinal(Box<Exchange>),
    Finished,
}

/// What the client-final message is checked against.
struct Exchange {
    username: String,
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    credential: ScramCredential,
}

impl ScramAuthenticator {
    pub(super) fn new(
        mechanism: ScramMechanism,
        cfg: &Arc<MechanismConfig>,
        creds: &Arc<dyn CredentialSource>,
    ) -> Self {
        Self {
            mechanism,
            cfg: Arc::clone(cfg),
            creds: Arc::clone(creds),
            state: State::ReceiveClientFirst,
            fixed_server_nonce: None,
        }
    }

    fn fail(&self) -> Step {
        invalid_credentials(self.mechanism.mechanism())
    }

    fn client_first(&self, client_bytes: &[u8]) -> Result<(Exchange, Vec<u8>), Step> {
        let message = std::str::from_utf8(client_bytes).map_err(|_| self.fail())?;
        let parts = CLIENT_FIRST.captures(message).ok_or_else(|| self.fail())?;
        let group = |name: &str| parts.name(name).map_or("", |m| m.as_str());

        // Kafka parses extensions as a map (the last value wins) and looks
        // delegation tokens up when `tokenauth` is true; there are none here.
        let token_auth = group("extensions")
            .split(',')
            .rev()
            .filter_map(|kv| kv.split_once('='))
            .find(|(key, _)| *key == TOKEN_AUTH)
            .is_some_and(|(_, value)| value.eq_ignore_ascii_case("true"));
        if token_auth {
            return Err(self.fail());
        }

        let username = decode_saslname(group("saslname"));
        // Checked before the credential lookup so that the answer is the
        // same for known and unknown users.
        let authzid = decode_saslname(group("authzid"));
        if !authzid.is_empty() && authzid != username {
            return Err(Step::Failed {
                message: "Authentication failed: Client requested an authorization id that is different from username".to_owned(),
            });
        }

        let credential = match self.creds.scram(self.mechanism, &username) {
            Some(credential) => credential,
            None => {
                let Settings::Scram(settings) = &self.cfg.settings else {
                    return Err(self.fail());
                };
                settings.fake_credential(self.mechanism, &username)
            }
        };
        if credential.iterations < ScramMechanism::MIN_ITERATIONS {
            return Err(self.fail());
        }

        let server_nonce = match &self.fixed_server_nonce {
            Some(nonce) => nonce.clone(),
            None => random_nonce().ok_or_else(|| self.fail())?,
        };
        let nonce = format!("{}{server_nonce}", group("nonce"));
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let challenge = server_first.as_bytes().to_vec();
        Ok((
            Exchange {
                username,
                gs2_header: group("gs2").to_owned(),
                client_first_bare: group("bare").to_owned(),
                server_first,
                nonce,
                credential,
            },
            challenge,
        ))
    }

    fn client_final(&self, exchange: &Exchange, client_bytes: &[u8]) -> Step {
        let Ok(message) = std::str::from_utf8(client_bytes) else {
            return self.fail();
        };
        let Some(parts) = CLIENT_FINAL.captures(message) else {
            return self.fail();
        };
        let group = |name: &str| parts.name(name).map_or("", |m| m.as_str());
        // Kafka: "Invalid client nonce in the final client message."
        if group("nonce") != exchange.nonce {
            return self.fail();
        }
        // RFC 5802: without channel binding, `c=` is the GS2 header again.
        // (Kafka does not check it; a client that lies here would be
        // signing a different header than the one it sent.)
        let channel = BASE64.decode(group("channel")).unwrap_or_default();
        if channel != exchange.gs2_header.as_bytes() {
            return self.fail();
        }
        let proof = BASE64.decode(group("proof")).unwrap_or_default();
        if proof.len() != self.mechanism.hash_len() {
            return self.fail();
        }

        let auth_message = format!(
            "{},{},{}",
            exchange.client_first_bare,
            exchange.server_first,
            group("without_proof")
        );
        let credential = &exchange.credential;
        let client_signature = self
            .mechanism
            .hmac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = client_signature
            .iter()
            .zip(&proof)
            .map(|(s, p)| s ^ p)
            .collect();
        // Kafka: "Invalid client credentials".
        if !constant_time_eq(&self.mechanism.hash(&client_key), &credential.stored_key) {
            return self.fail();
        }
        let server_signature = self
            .mechanism
            .hmac(&credential.server_key, auth_message.as_bytes());
        Step::Done {
            principal: exchange.username.clone(),
            response: format!("v={}", BASE64.encode(server_signature)).into_bytes(),
            lifetime_ms: None,
        }
    }
}

impl Authenticator for ScramAuthenticator {
    fn step(&mut self, client_bytes: &[u8]) -> Step {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::ReceiveClientFirst => match self.client_first(client_bytes) {
                Ok((exchange, challenge)) => {
                    self.state = State::ReceiveClientFinal(Box::new(exchange));
                    Step::Challenge(challenge)
                }
                Err(step) => step,
            },
            State::ReceiveClientFinal(exchange) => self.client_final(&exchange, client_bytes),
            State::Finished => self.fail(),
        }
    }
}

/// Undoes RFC 5802's `=2C` (`,`) and `=3D` (`=`); the grammar has already
/// refused any other `=`.
fn decode_saslname(name: &str) -> String {
    name.replace("=2C", ",").replace("=3D", "=")
}

/// 144 random bits, base64: printable and comma-free, as the grammar needs.
pub(super) fn random_nonce() -> Option<String> {
    let mut bytes = [0u8; 18];
    getrandom::fill(&mut bytes).ok()?;
    Some(BASE64.encode(bytes))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::security::sasl::authenticator;
    use crate::security::sasl::tests::generic_failure;

    struct Users(HashMap<(ScramMechanism, String), ScramCredential>);

    impl CredentialSource for Users {
        fn scram(&self, mechanism: ScramMechanism, user: &str) -> Option<ScramCredential> {
            self.0.get(&(mechanism, user.to_owned())).cloned()
        }
    }

    fn creds(users: &[(ScramMechanism, &str, ScramCredential)]) -> Arc<dyn CredentialSource> {
        Arc::new(Users(
            users
                .iter()
                .map(|(m, u, c)| ((*m, (*u).to_owned()), c.clone()))
                .collect(),
        ))
    }

    fn config(mech: Mechanism) -> Arc<MechanismConfig> {
        Arc::new(MechanismConfig::from_config(mech, &|_| None).unwrap())
    }

    /// A SCRAM client, as RFC 5802 describes it.
    struct Client {
        mech: ScramMechanism,
        password: String,
        gs2_header: String,
        client_nonce: String,
        client_first_bare: String,
    }

    impl Client {
        fn new(mech: ScramMechanism, user: &str, password: &str) -> Self {
            let client_nonce = "fyko+d2lbbFgONRv9qkxdawL".to_owned();
            Self {
                mech,
                password: password.to_owned(),
                gs2_header: "n,,".to_owned(),
                client_first_bare: format!("n={user},r={client_nonce}"),
                client_nonce,
            }
        }

        fn first(&self) -> Vec<u8> {
            format!("{}{}", self.gs2_header, self.client_first_bare).into_bytes()
        }

        /// The client-final message for `server_first`, and the server
        /// signature the client expects back.
        fn last(&self, server_first: &[u8]) -> (Vec<u8>, Vec<u8>) {
            let server_first = std::str::from_utf8(server_first).unwrap();
            let mut fields = HashMap::new();
            for part in server_first.split(',') {
                let (k, v) = part.split_once('=').unwrap();
                fields.insert(k, v);
            }
            let nonce = fields["r"];
            assert!(nonce.starts_with(&self.client_nonce), "{server_first}");
            assert!(nonce.len() > self.client_nonce.len(), "{server_first}");
            let salt = BASE64.decode(fields["s"]).unwrap();
            let iterations: u32 = fields["i"].parse().unwrap();
            let salted = self.mech.hi(self.password.as_bytes(), &salt, iterations);
            let client_key = self.mech.hmac(&salted, b"Client Key");
            let stored_key = self.mech.hash(&client_key);
            let without_proof = format!("c={},r={nonce}", BASE64.encode(&self.gs2_header));
            let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
            let signature = self.mech.hmac(&stored_key, auth_message.as_bytes());
            let proof: Vec<u8> = client_key
                .iter()
                .zip(&signature)
                .map(|(a, b)| a ^ b)
                .collect();
            let server_key = self.mech.hmac(&salted, b"Server Key");
            let server_signature = self.mech.hmac(&server_key, auth_message.as_bytes());
            (
                format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
                format!("v={}", BASE64.encode(server_signature)).into_bytes(),
            )
        }
    }

    fn challenge(step: Step) -> Vec<u8> {
        match step {
            Step::Challenge(bytes) => bytes,
            other => panic!("expected a challenge, got {other:?}"),
        }
    }

    const RFC7677_SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";

    #[test]
    fn rfc_7677_example() {
        let salt = BASE64.decode(RFC7677_SALT).unwrap();
        let credential =
            ScramCredential::from_password(ScramMechanism::Sha256, "pencil", &salt, 4096);
        let creds = creds(&[(ScramMechanism::Sha256, "user", credential)]);
        let mut auth = ScramAuthenticator::new(
            ScramMechanism::Sha256,
            &config(Mechanism::ScramSha256),
            &creds,
        );
        auth.fixed_server_nonce = Some("%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".to_owned());

        let server_first = challenge(auth.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"));
        assert_eq!(
            server_first,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let step = auth.step(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
              p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        );
        assert_eq!(
            step,
            Step::Done {
                principal: "user".to_owned(),
                response: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec(),
                lifetime_ms: None,
            }
        );
        // The exchange is over.
        assert_eq!(
            auth.step(b"c=biws"),
            generic_failure(Mechanism::ScramSha256)
        );
    }

    #[test]
    fn salted_password_gives_the_same_credential() {
        let salt = BASE64.decode(RFC7677_SALT).unwrap();
        for mech in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            let from_password = ScramCredential::from_password(mech, "pencil", &salt, 4096);
            let salted = mech.hi(b"pencil", &salt, 4096);
            assert_eq!(
                ScramCredential::from_salted_password(mech, &salted, &salt, 4096),
                from_password
            );
            assert_eq!(from_password.stored_key.len(), mech.hash_len());
            assert_eq!(from_password.server_key.len(), mech.hash_len());
        }
    }

    fn sha512_setup() -> (Arc<MechanismConfig>, Arc<dyn CredentialSource>) {
        let credential = ScramCredential::from_password(
            ScramMechanism::Sha512,
            "alice-secret",
            b"some salt",
            4096,
        );
        (
            config(Mechanism::ScramSha512),
            creds(&[(ScramMechanism::Sha512, "alice", credential)]),
        )
    }

    /// Runs a full exchange and returns the final step, checking the
    /// server signature when it succeeds.
    fn exchange(
        mech: Mechanism,
        client: &Client,
        cfg: &Arc<MechanismConfig>,
        creds: &Arc<dyn CredentialSource>,
    ) -> Step {
        let mut auth = authenticator(mech, cfg, creds);
        let server_first = challenge(auth.step(&client.first()));
        let (last, server_final) = client.last(&server_first);
        let step = auth.step(&last);
        if let Step::Done { response, .. } = &step {
            assert_eq!(response, &server_final);
        }
        step
    }

    #[test]
    fn sha512_full_exchange() {
        let (cfg, creds) = sha512_setup();
        let client = Client::new(ScramMechanism::Sha512, "alice", "alice-secret");
        let Step::Done {
            principal,
            lifetime_ms,
            ..
        } = exchange(Mechanism::ScramSha512, &client, &cfg, &creds)
        else {
            panic!("alice did not authenticate");
        };
        assert_eq!(principal, "alice");
        assert_eq!(lifetime_ms, None);
    }

    #[test]
    fn gs2_flag_y_and_matching_authzid_are_accepted() {
        let (cfg, creds) = sha512_setup();
        for header in ["y,,", "n,a=alice,", "y,a=alice,"] {
            let mut client = Client::new(ScramMechanism::Sha512, "alice", "alice-secret");
            client.gs2_header = header.to_owned();
            assert!(
                matches!(
                    exchange(Mechanism::ScramSha512, &client, &cfg, &creds),
                    Step::Done { .. }
                ),
                "{header}"
            );
        }
    }

    #[test]
    fn escaped_user_names() {
        let credential =
            ScramCredential::from_password(ScramMechanism::Sha256, "pw", b"salt", 4096);
        let creds = creds(&[(ScramMechanism::Sha256, "a,b=c", credential)]);
        let mut client = Client::new(ScramMechanism::Sha256, "a=2Cb=3Dc", "pw");
        client.gs2_header = "n,a=a=2Cb=3Dc,".to_owned();
        let step = exchange(
            Mechanism::ScramSha256,
            &client,
            &config(Mechanism::ScramSha256),
            &creds,
        );
        assert!(
            matches!(step, Step::Done { ref principal, .. } if principal == "a,b=c"),
            "{step:?}"
        );
    }

    #[test]
    fn wrong_password_and_unknown_user_fail_alike_at_the_proof() {
        let (cfg, creds) = sha512_setup();
        let generic = generic_failure(Mechanism::ScramSha512);
        let wrong = Client::new(ScramMechanism::Sha512, "alice", "wrong");
        assert_eq!(
            exchange(Mechanism::ScramSha512, &wrong, &cfg, &creds),
            generic
        );

        // The unknown user gets a challenge shaped like a real one, with a
        // salt that does not change between attempts.
        let unknown = Client::new(ScramMechanism::Sha512, "mallory", "alice-secret");
        let first_salt = |auth: &mut Box<dyn Authenticator>| {
            let server_first = String::from_utf8(challenge(auth.step(&unknown.first()))).unwrap();
            let salt = server_first.split(',').nth(1).unwrap().to_owned();
            assert!(server_first.ends_with(",i=4096"), "{server_first}");
            salt
        };
        let mut auth = authenticator(Mechanism::ScramSha512, &cfg, &creds);
        let salt = first_salt(&mut auth);
        let mut again = authenticator(Mechanism::ScramSha512, &cfg, &creds);
        assert_eq!(first_salt(&mut again), salt);
        assert_eq!(
            exchange(Mechanism::ScramSha512, &unknown, &cfg, &creds),
            generic
        );
    }

    #[test]
    fn different_authzid_is_refused_for_known_and_unknown_users() {
        let (cfg, creds) = sha512_setup();
        for user in ["alice", "mallory"] {
            let mut auth = authenticator(Mechanism::ScramSha512, &cfg, &creds);
            assert_eq!(
                auth.step(format!("n,a=admin,n={user},r=abc").as_bytes()),
                Step::Failed {
                    message: "Authentication failed: Client requested an authorization id that is different from username".to_owned()
                }
            );
        }
    }

    #[test]
    fn malformed_client_first_messages() {
        let (cfg, creds) = sha512_setup();
        let mut huge = b"n,,n=alice,r=".to_vec();
        huge.resize(1 << 20, b'x');
        huge.extend_from_slice(b",");
        for message in [
            &b""[..],
            b"n",
            b"n,,",
            b"n,,n=alice",
            b"n,,n=alice,r=",
            b"n,,r=abc,n=alice",
            b"n,,n=alice;r=abc",
            b"p=tls-unique,,n=alice,r=abc",
            b"x,,n=alice,r=abc",
            b"n,,n=al=ice,r=abc",
            b"n,,n=al\xffice,r=abc",
            b"n,,n=al\0ice,r=abc",
            b"n,,n=alice,r=a b",
            b"n,,n=alice,r=abc,tokenauth=true",
            b"n,,n=alice,r=abc,tokenauth=TRUE",
            &huge,
        ] {
            let mut auth = authenticator(Mechanism::ScramSha512, &cfg, &creds);
            assert_eq!(
                auth.step(message),
                generic_failure(Mechanism::ScramSha512),
                "{:?}",
                String::from_utf8_lossy(&message[..message.len().min(40)])
            );
            // A failed exchange stays failed.
            assert_eq!(
                auth.step(&Client::new(ScramMechanism::Sha512, "alice", "alice-secret").first()),
                generic_failure(Mechanism::ScramSha512)
            );
        }
        // Unknown extensions are ignored, as in Kafka, and so is tokenauth=false.
        for extensions in [",ext=1", ",tokenauth=false"] {
            let mut client = Client::new(ScramMechanism::Sha512, "alice", "alice-secret");
            client.client_first_bare.push_str(extensions);
            assert!(matches!(
                exchange(Mechanism::ScramSha512, &client, &cfg, &creds),
                Step::Done { .. }
            ));
        }
    }

    #[test]
    fn malformed_client_final_messages() {
        let (cfg, creds) = sha512_setup();
        let client = Client::new(ScramMechanism::Sha512, "alice", "alice-secret");
        let first_then = |last: &dyn Fn(&str) -> Vec<u8>| {
            let mut auth = authenticator(Mechanism::ScramSha512, &cfg, &creds);
            let server_first = challenge(auth.step(&client.first()));
            let (good, _) = client.last(&server_first);
            auth.step(&last(std::str::from_utf8(&good).unwrap()))
        };
        let generic = generic_failure(Mechanism::ScramSha512);
        // Mismatched nonce: the client's part only, or a changed server part.
        assert_eq!(
            first_then(&|good| good.replacen("r=fyko", "r=Fyko", 1).into_bytes()),
            generic
        );
        assert_eq!(
            first_then(&|good| {
                let (head, proof) = good.split_once(",p=").unwrap();
                format!("{head}x,p={proof}").into_bytes()
            }),
            generic
        );
        // Channel binding data that is not the GS2 header.
        assert_eq!(
            first_then(&|good| good.replacen("c=biws", "c=eSws", 1).into_bytes()),
            generic
        );
        // Truncated, missing the proof, a short proof, bad base64, empty, non-UTF-8.
        assert_eq!(
            first_then(&|good| good.as_bytes()[..good.len() - 5].to_vec()),
            generic
        );
        assert_eq!(
            first_then(&|good| good.split_once(",p=").unwrap().0.as_bytes().to_vec()),
            generic
        );
        assert_eq!(
            first_then(
                &|good| format!("{},p=AAAA", good.split_once(",p=").unwrap().0).into_bytes()
            ),
            generic
        );
        assert_eq!(
            first_then(
                &|good| format!("{},p=!!!!", good.split_once(",p=").unwrap().0).into_bytes()
            ),
            generic
        );
        assert_eq!(first_then(&|_| Vec::new()), generic);
        assert_eq!(
            first_then(&|good| [good.as_bytes(), b"\xff"].concat()),
            generic
        );
        // The unchanged message still works.
        assert!(matches!(
            first_then(&|good| good.as_bytes().to_vec()),
            Step::Done { .. }
        ));
    }

    #[test]
    fn credentials_below_kafkas_minimum_iterations_are_refused() {
        let credential =
            ScramCredential::from_password(ScramMechanism::Sha256, "pw", b"salt", 4095);
        let creds = creds(&[(ScramMechanism::Sha256, "bob", credential)]);
        let mut auth = authenticator(
            Mechanism::ScramSha256,
            &config(Mechanism::ScramSha256),
            &creds,
        );
        assert_eq!(
            auth.step(b"n,,n=bob,r=abc"),
            generic_failure(Mechanism::ScramSha256)
        );
    }

    #[test]
    fn mechanisms_do_not_share_credentials() {
        let (_, creds) = sha512_setup();
        // alice has only a SHA-512 credential: SHA-256 treats her as unknown.
        let client = Client::new(ScramMechanism::Sha256, "alice", "alice-secret");
        assert_eq!(
            exchange(
                Mechanism::ScramSha256,
                &client,
                &config(Mechanism::ScramSha256),
                &creds
            ),
            generic_failure(Mechanism::ScramSha256)
        );
    }

    #[test]
    fn wire_type_ids() {
        assert_eq!(ScramMechanism::Sha256.type_id(), 1);
        assert_eq!(ScramMechanism::Sha512.type_id(), 2);
        for mech in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            assert_eq!(ScramMechanism::from_type_id(mech.type_id()), Some(mech));
        }
        assert_eq!(ScramMechanism::from_type_id(0), None);
        assert_eq!(ScramMechanism::from_type_id(3), None);
        assert_eq!(ScramMechanism::Sha512.mechanism().name(), "SCRAM-SHA-512");
    }

    #[test]
    fn debug_hides_keys() {
        let credential =
            ScramCredential::from_password(ScramMechanism::Sha256, "pw", b"salt", 4096);
        let debug = format!("{credential:?}");
        assert_eq!(debug, "ScramCredential { iterations: 4096, .. }");
    }
}
