//! SASL/PLAIN (RFC 4616) as Kafka's `PlainSaslServer` with its default
//! `PlainServerCallbackHandler`: one client message
//! `authzid NUL authcid NUL passwd`, checked against the `user_<name>`
//! options of `PlainLoginModule` in `sasl.jaas.config`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::jaas::LoginModuleEntry;
use super::{
    constant_time_eq, invalid_credentials, Authenticator, Mechanism, MechanismConfig,
    SaslConfigError, Settings, Step, SASL_JAAS_CONFIG,
};

const PLAIN_LOGIN_MODULE: &str = "org.apache.kafka.common.security.plain.PlainLoginModule";
const JAAS_USER_PREFIX: &str = "user_";

/// The users PLAIN accepts, from `user_<name>="<password>"` options.
pub(super) struct PlainUsers {
    /// SHA-256 of each password, so that comparing takes the same time
    /// whatever the lengths of the stored and the offered password.
    password_digests: BTreeMap<String, [u8; 32]>,
}

impl PlainUsers {
    /// Kafka's callback handler reads users only from `PlainLoginModule`'s
    /// options; a PLAIN listener without any user could never authenticate
    /// anyone, so it is refused at startup.
    pub(super) fn from_jaas(jaas: Option<&LoginModuleEntry>) -> Result<Self, SaslConfigError> {
        let Some(entry) = jaas else {
            return Err(SaslConfigError::new(
                SASL_JAAS_CONFIG,
                format!("PLAIN needs a {PLAIN_LOGIN_MODULE} entry with user_<name>=\"<password>\" options"),
            ));
        };
        if entry.login_module != PLAIN_LOGIN_MODULE {
            return Err(SaslConfigError::new(
                SASL_JAAS_CONFIG,
                format!(
                    "PLAIN needs login module {PLAIN_LOGIN_MODULE}, not {}",
                    entry.login_module
                ),
            ));
        }
        let password_digests: BTreeMap<_, _> = entry
            .options
            .iter()
            .filter_map(|(key, password)| {
                let user = key.strip_prefix(JAAS_USER_PREFIX)?;
                Some((user.to_owned(), digest(password.as_bytes())))
            })
            .collect();
        if password_digests.is_empty() {
            return Err(SaslConfigError::new(
                SASL_JAAS_CONFIG,
                format!("{PLAIN_LOGIN_MODULE} has no user_<name>=\"<password>\" option"),
            ));
        }
        Ok(Self { password_digests })
    }

    /// Whether `password` is `user`'s. An unknown user costs the same
    /// comparison as a known one.
    fn authenticate(&self, user: &str, password: &str) -> bool {
        let offered = digest(password.as_bytes());
        match self.password_digests.get(user) {
            Some(expected) => constant_time_eq(&offered, expected),
            None => {
                constant_time_eq(&offered, &[0; 32]);
                false
            }
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

pub(super) struct PlainAuthenticator {
    cfg: Arc<MechanismConfig>,
    finished: bool,
}

impl PlainAuthenticator {
    pub(super) fn new(cfg: &Arc<MechanismConfig>) -> Self {
        Self {
            cfg: Arc::clone(cfg),
            finished: false,
        }
    }
}

impl Authenticator for PlainAuthenticator {
    fn step(&mut self, client_bytes: &[u8]) -> Step {
        if self.finished {
            return invalid_credentials(Mechanism::Plain);
        }
        self.finished = true;
        let Settings::Plain(users) = &self.cfg.settings else {
            return invalid_credentials(Mechanism::Plain);
        };
        evaluate(users, client_bytes)
    }
}

/// Kafka's `PlainSaslServer.evaluateResponse`.
fn evaluate(users: &PlainUsers, client_bytes: &[u8]) -> Step {
    // Java's `new String(bytes, UTF_8)`: invalid sequences become U+FFFD,
    // so a non-UTF-8 password is simply a wrong password.
    let message = String::from_utf8_lossy(client_bytes);
    let tokens: Vec<&str> = message.split('\0').collect();
    // RFC 4616 has exactly two NULs. Kafka reads missing tokens as empty
    // (and fails on the empty username or password below); it ignores
    // anything after a third NUL, which is refused here instead.
    if tokens.len() > 3 {
        return invalid_credentials(Mechanism::Plain);
    }
    let token = |i: usize| tokens.get(i).copied().unwrap_or("");
    let (authzid, username, password) = (token(0), token(1), token(2));
    if username.is_empty() || password.is_empty() {
        return invalid_credentials(Mechanism::Plain);
    }
    if !users.authenticate(username, password) {
        return failed("Authentication failed: Invalid username or password");
    }
    if !authzid.is_empty() && authzid != username {
        return failed(
            "Authentication failed: Client requested an authorization id that is different from username",
        );
    }
    Step::Done {
        principal: username.to_owned(),
        response: Vec::new(),
        lifetime_ms: None,
    }
}

fn failed(message: &str) -> Step {
    Step::Failed {
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::sasl::tests::{generic_failure, no_credentials};
    use crate::security::sasl::{authenticator, SaslConfigError};

    const JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret"
        user_admin="admin-secret" user_alice="alice-secret" user_empty="";"#;

    fn config(jaas: Option<&str>) -> Result<MechanismConfig, SaslConfigError> {
        MechanismConfig::from_config(Mechanism::Plain, &|key| {
            (key == SASL_JAAS_CONFIG)
                .then(|| jaas.map(str::to_owned))
                .flatten()
        })
    }

    fn run(message: &[u8]) -> Step {
        let cfg = Arc::new(config(Some(JAAS)).unwrap());
        authenticator(Mechanism::Plain, &cfg, &no_credentials()).step(message)
    }

    fn done(user: &str) -> Step {
        Step::Done {
            principal: user.to_owned(),
            response: Vec::new(),
            lifetime_ms: None,
        }
    }

    #[test]
    fn valid_users_authenticate() {
        assert_eq!(run(b"\0alice\0alice-secret"), done("alice"));
        assert_eq!(run(b"\0admin\0admin-secret"), done("admin"));
        // An authorization id equal to the username is allowed.
        assert_eq!(run(b"alice\0alice\0alice-secret"), done("alice"));
    }

    #[test]
    fn wrong_password_and_unknown_user_get_the_same_message() {
        let invalid = failed("Authentication failed: Invalid username or password");
        assert_eq!(run(b"\0alice\0admin-secret"), invalid);
        assert_eq!(run(b"\0alice\0alice-secret "), invalid);
        assert_eq!(run(b"\0alice\0alice-secre"), invalid);
        assert_eq!(run(b"\0mallory\0alice-secret"), invalid);
        // `username`/`password` are the broker's own client login, not a user.
        assert_eq!(run(b"\0username\0admin"), invalid);
        // A configured empty password can never match: empty is refused first.
        assert_eq!(run(b"\0empty\0"), generic_failure(Mechanism::Plain));
        // Non-UTF-8 bytes decode to U+FFFD, as in Java, and so mismatch.
        assert_eq!(run(b"\0alice\0alice-secret\xff"), invalid);
    }

    #[test]
    fn different_authorization_id_is_refused_after_the_password() {
        assert_eq!(
            run(b"admin\0alice\0alice-secret"),
            failed("Authentication failed: Client requested an authorization id that is different from username")
        );
        // With a wrong password the password failure comes first, as in Kafka.
        assert_eq!(
            run(b"admin\0alice\0wrong"),
            failed("Authentication failed: Invalid username or password")
        );
    }

    #[test]
    fn malformed_messages_get_the_generic_message() {
        let generic = generic_failure(Mechanism::Plain);
        for message in [
            &b""[..],
            b"alice",
            b"\0alice",
            b"\0alice\0",
            b"\0\0alice-secret",
            b"\0\0",
            b"\0alice\0alice-secret\0",
            b"\0alice\0alice-secret\0extra",
        ] {
            assert_eq!(run(message), generic, "{message:?}");
        }
        let mut huge = b"\0alice\0".to_vec();
        huge.resize(1 << 20, b'x');
        assert_eq!(
            run(&huge),
            failed("Authentication failed: Invalid username or password")
        );
    }

    #[test]
    fn one_message_per_exchange() {
        let cfg = Arc::new(config(Some(JAAS)).unwrap());
        let mut auth = authenticator(Mechanism::Plain, &cfg, &no_credentials());
        assert_eq!(auth.step(b"\0alice\0alice-secret"), done("alice"));
        assert_eq!(
            auth.step(b"\0alice\0alice-secret"),
            generic_failure(Mechanism::Plain)
        );
    }

    #[test]
    fn configuration_errors_name_the_key() {
        for jaas in [
            None,
            Some("org.apache.kafka.common.security.plain.PlainLoginModule required username=\"a\" password=\"b\";"),
            Some("org.apache.kafka.common.security.scram.ScramLoginModule required user_a=\"b\";"),
            Some("org.apache.kafka.common.security.plain.PlainLoginModule required user_a=\"b\""),
        ] {
            let err = config(jaas).unwrap_err();
            assert_eq!(err.key, "sasl.jaas.config", "{jaas:?}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
