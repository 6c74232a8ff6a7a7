//! The client side of PLAIN and SCRAM-SHA-256/512, for the broker's own
//! connections to its peers (replica fetchers and transaction markers on the
//! inter-broker listener, voters on the controller listener). Pure state
//! machines, like the server side: the first message, then the server's
//! bytes in and a [`ClientStep`] out.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

use super::scram::random_nonce;
use super::{
    constant_time_eq, CredentialSource, Mechanism, ScramCredential, ScramMechanism,
    UnsupportedMechanism,
};

/// What the client does with the server's answer to its last message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientStep {
    /// Send these bytes next.
    Send(Vec<u8>),
    /// The exchange is complete (for SCRAM: the server proved it knows the
    /// credential too).
    Done,
}

/// One client-side SASL exchange.
pub trait ClientAuthenticator: Send {
    /// The client's first message (PLAIN's only one).
    fn initial(&mut self) -> Vec<u8>;
    /// The server's bytes after a successful SaslAuthenticate (or the
    /// controller transport's equivalent). `Err` with why the exchange cannot
    /// go on; the caller closes the connection.
    fn step(&mut self, server_bytes: &[u8]) -> Result<ClientStep, String>;
}

/// A client exchange for `mech` logging in as `username`. OAUTHBEARER is
/// not offered between brokers (it would need a token source).
pub fn client_authenticator(
    mech: Mechanism,
    username: &str,
    password: &str,
) -> Result<Box<dyn ClientAuthenticator>, UnsupportedMechanism> {
    match mech {
        Mechanism::Plain => Ok(Box::new(PlainClient {
            username: username.to_owned(),
            password: password.to_owned(),
            sent: false,
        })),
        Mechanism::ScramSha256 => Ok(Box::new(ScramClient::new(
            ScramMechanism::Sha256,
            username,
            password,
        ))),
        Mechanism::ScramSha512 => Ok(Box::new(ScramClient::new(
            ScramMechanism::Sha512,
            username,
            password,
        ))),
        Mechanism::OAuthBearer => Err(UnsupportedMechanism(mech.name().to_owned())),
    }
}

/// SCRAM credentials for nobody: a server that serves only PLAIN (the
/// controller listener) still hands the mechanism layer a source.
pub struct NoCredentials;

impl CredentialSource for NoCredentials {
    fn scram(&self, _mechanism: ScramMechanism, _user: &str) -> Option<ScramCredential> {
        None
    }
}

/// RFC 4616: `authzid NUL authcid NUL passwd` with an empty authzid, as
/// Kafka's `PlainSaslClient` sends it.
struct PlainClient {
    username: String,
    password: String,
    sent: bool,
}

impl ClientAuthenticator for PlainClient {
    fn initial(&mut self) -> Vec<u8> {
        self.sent = true;
        format!("\0{}\0{}", self.username, self.password).into_bytes()
    }

    fn step(&mut self, _server_bytes: &[u8]) -> Result<ClientStep, String> {
        if self.sent {
            Ok(ClientStep::Done)
        } else {
            Err("PLAIN: the server answered before the client spoke".into())
        }
    }
}

/// RFC 5802's client without channel binding (GS2 header `n,,`), as
/// Kafka's `ScramSaslClient`.
struct ScramClient {
    mechanism: ScramMechanism,
    username: String,
    password: String,
    client_nonce: String,
    state: ScramState,
}

enum ScramState {
    Start,
    SentClientFirst,
    /// The server signature the server-final message must carry.
    SentClientFinal {
        server_signature: Vec<u8>,
    },
    Finished,
}

const GS2_HEADER: &str = "n,,";

impl ScramClient {
    fn new(mechanism: ScramMechanism, username: &str, password: &str) -> Self {
        Self {
            mechanism,
            username: username.to_owned(),
            password: password.to_owned(),
            // An empty nonce makes the server's first message fail our check
            // below rather than succeed with a predictable nonce.
            client_nonce: random_nonce().unwrap_or_default(),
            state: ScramState::Start,
        }
    }

    fn client_first_bare(&self) -> String {
        let name = self.username.replace('=', "=3D").replace(',', "=2C");
        format!("n={name},r={}", self.client_nonce)
    }

    fn client_final(&self, server_first: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("e", v)) => return Err(format!("SCRAM: the server refused: {v}")),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err("SCRAM: malformed server-first message".into());
        };
        if self.client_nonce.is_empty()
            || !nonce.starts_with(&self.client_nonce)
            || nonce.len() == self.client_nonce.len()
        {
            return Err("SCRAM: the server's nonce does not extend ours".into());
        }
        let salt = BASE64
            .decode(salt)
            .map_err(|_| "SCRAM: the salt is not base64".to_string())?;
        let iterations: i32 = iterations
            .parse()
            .map_err(|_| "SCRAM: the iteration count is not a number".to_string())?;
        // Kafka's client refuses fewer iterations than the mechanism's
        // minimum; so does this one, and more than the maximum (a server
        // should not make a client hash for minutes).
        if !(ScramMechanism::MIN_ITERATIONS..=ScramMechanism::MAX_ITERATIONS).contains(&iterations)
        {
            return Err(format!(
                "SCRAM: the server asks for {iterations} iterations"
            ));
        }
        let m = self.mechanism;
        let salted = m.hi(self.password.as_bytes(), &salt, iterations as u32);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c={},r={nonce}", BASE64.encode(GS2_HEADER));
        let auth_message = format!(
            "{},{server_first},{without_proof}",
            self.client_first_bare()
        );
        let signature = m.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        let server_signature = m.hmac(&server_key, auth_message.as_bytes());
        Ok((
            format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes(),
            server_signature,
        ))
    }
}

impl ClientAuthenticator for ScramClient {
    fn initial(&mut self) -> Vec<u8> {
        self.state = ScramState::SentClientFirst;
        format!("{GS2_HEADER}{}", self.client_first_bare()).into_bytes()
    }

    fn step(&mut self, server_bytes: &[u8]) -> Result<ClientStep, String> {
        let message = std::str::from_utf8(server_bytes)
            .map_err(|_| "SCRAM: the server's message is not UTF-8".to_string())?;
        match std::mem::replace(&mut self.state, ScramState::Finished) {
            ScramState::SentClientFirst => {
                let (client_final, server_signature) = self.client_final(message)?;
                self.state = ScramState::SentClientFinal { server_signature };
                Ok(ClientStep::Send(client_final))
            }
            ScramState::SentClientFinal { server_signature } => {
                if let Some(e) = message.strip_prefix("e=") {
                    return Err(format!("SCRAM: the server refused: {e}"));
                }
                let offered = message
                    .strip_prefix("v=")
                    .and_then(|v| BASE64.decode(v).ok())
                    .ok_or_else(|| "SCRAM: malformed server-final message".to_string())?;
                if constant_time_eq(&offered, &server_signature) {
                    Ok(ClientStep::Done)
                } else {
                    Err("SCRAM: the server's signature is wrong: it does not know this user's credential".into())
                }
            }
            ScramState::Start | ScramState::Finished => {
                Err("SCRAM: unexpected server message".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::security::sasl::{authenticator, MechanismConfig, Step};

    struct One(ScramMechanism, &'static str, ScramCredential);

    impl CredentialSource for One {
        fn scram(&self, mechanism: ScramMechanism, user: &str) -> Option<ScramCredential> {
            (mechanism == self.0 && user == self.1).then(|| self.2.clone())
        }
    }

    /// Runs a client against our server; the principal, or why it failed
    /// (the server's message or the client's).
    fn exchange(
        mech: Mechanism,
        user: &str,
        password: &str,
        server_cfg: Arc<MechanismConfig>,
        creds: Arc<dyn CredentialSource>,
    ) -> Result<String, String> {
        let mut client = client_authenticator(mech, user, password).unwrap();
        let mut server = authenticator(mech, &server_cfg, &creds);
        let mut token = client.initial();
        loop {
            match server.step(&token) {
                Step::Challenge(bytes) => match client.step(&bytes)? {
                    ClientStep::Send(next) => token = next,
                    ClientStep::Done => return Err("client done before server".into()),
                },
                Step::Done {
                    principal,
                    response,
                    ..
                } => {
                    return match client.step(&response)? {
                        ClientStep::Done => Ok(principal),
                        ClientStep::Send(_) => Err("server done before client".into()),
                    }
                }
                Step::Failed { message } => return Err(message),
            }
        }
    }

    #[test]
    fn scram_clients_log_in_to_our_server_and_check_its_signature() {
        for (mech, scram) in [
            (Mechanism::ScramSha256, ScramMechanism::Sha256),
            (Mechanism::ScramSha512, ScramMechanism::Sha512),
        ] {
            let cfg = Arc::new(MechanismConfig::from_config(mech, &|_| None).unwrap());
            let cred = ScramCredential::from_password(scram, "s3cret,=x", b"salty", 4096);
            let creds: Arc<dyn CredentialSource> = Arc::new(One(scram, "broker,=1", cred));
            assert_eq!(
                exchange(mech, "broker,=1", "s3cret,=x", cfg.clone(), creds.clone()),
                Ok("broker,=1".to_string())
            );
            let wrong = exchange(mech, "broker,=1", "wrong", cfg.clone(), creds.clone());
            assert!(wrong.unwrap_err().contains("invalid credentials"));
            let unknown = exchange(mech, "nobody", "s3cret,=x", cfg, creds);
            assert!(unknown.unwrap_err().contains("invalid credentials"));
        }
    }

    #[test]
    fn a_server_that_does_not_know_the_credential_is_caught() {
        let mut client = client_authenticator(Mechanism::ScramSha256, "u", "p").unwrap();
        let first = String::from_utf8(client.initial()).unwrap();
        let nonce = first.rsplit_once("r=").unwrap().1.to_string();
        let server_first = format!("r={nonce}abc,s={},i=4096", BASE64.encode(b"salt"));
        assert!(matches!(
            client.step(server_first.as_bytes()),
            Ok(ClientStep::Send(_))
        ));
        let forged = format!("v={}", BASE64.encode([0u8; 32]));
        assert!(client.step(forged.as_bytes()).is_err());
        // A nonce that does not extend ours, and absurd iteration counts.
        for bad in [
            format!("r=other,s={},i=4096", BASE64.encode(b"salt")),
            format!("r={nonce}x,s={},i=1", BASE64.encode(b"salt")),
            format!("r={nonce}x,s={},i=100000000", BASE64.encode(b"salt")),
        ] {
            let mut c = client_authenticator(Mechanism::ScramSha256, "u", "p").unwrap();
            let first = String::from_utf8(c.initial()).unwrap();
            let n = first.rsplit_once("r=").unwrap().1;
            let bad = bad.replace(&nonce, n);
            assert!(c.step(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_clients_log_in_to_our_server() {
        let jaas =
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_broker="pw";"#;
        let get = |key: &str| (key == super::super::SASL_JAAS_CONFIG).then(|| jaas.to_owned());
        let cfg = Arc::new(MechanismConfig::from_config(Mechanism::Plain, &get).unwrap());
        let creds: Arc<dyn CredentialSource> = Arc::new(NoCredentials);
        assert_eq!(
            exchange(Mechanism::Plain, "broker", "pw", cfg.clone(), creds.clone()),
            Ok("broker".to_string())
        );
        assert!(exchange(Mechanism::Plain, "broker", "no", cfg, creds).is_err());
        assert!(client_authenticator(Mechanism::OAuthBearer, "a", "b").is_err());
    }
}
