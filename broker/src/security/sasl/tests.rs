//! Tests across mechanisms, and the helpers the mechanisms' tests share.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;

/// Kafka's reply to a `SaslException` for `mech`.
pub(super) fn generic_failure(mech: Mechanism) -> Step {
    invalid_credentials(mech)
}

struct NoCredentials;

impl CredentialSource for NoCredentials {
    fn scram(&self, _mechanism: ScramMechanism, _user: &str) -> Option<ScramCredential> {
        None
    }
}

pub(super) fn no_credentials() -> Arc<dyn CredentialSource> {
    Arc::new(NoCredentials)
}

#[test]
fn mechanism_names_round_trip() {
    for mech in Mechanism::ALL {
        assert_eq!(mech.name().parse::<Mechanism>(), Ok(mech));
        assert_eq!(mech.to_string(), mech.name());
    }
    assert_eq!(
        "GSSAPI".parse::<Mechanism>(),
        Err(UnsupportedMechanism("GSSAPI".to_owned()))
    );
    // Kafka compares mechanism names exactly.
    assert!("plain".parse::<Mechanism>().is_err());
}

#[test]
fn generic_failure_is_kafkas_wording() {
    assert_eq!(
        generic_failure(Mechanism::ScramSha256),
        Step::Failed {
            message: "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256".to_owned()
        }
    );
}

const PLAIN_JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="alice-secret";"#;

fn configs() -> Vec<Arc<MechanismConfig>> {
    Mechanism::ALL
        .into_iter()
        .map(|mech| {
            let get = |key: &str| (key == SASL_JAAS_CONFIG).then(|| PLAIN_JAAS.to_owned());
            Arc::new(MechanismConfig::from_config(mech, &get).unwrap())
        })
        .collect()
}

#[test]
fn a_configuration_for_another_mechanism_refuses() {
    let configs = configs();
    let plain = &configs[0];
    let mut auth = authenticator(Mechanism::ScramSha256, plain, &no_credentials());
    assert_eq!(
        auth.step(b"n,,n=alice,r=abc"),
        generic_failure(Mechanism::ScramSha256)
    );
    assert_eq!(
        format!("{plain:?}"),
        "MechanismConfig { mechanism: Plain, .. }"
    );
}

/// Well-formed first messages, so that the random bytes also reach the
/// later states (SCRAM's client-final, OAUTHBEARER's acknowledgement).
fn first_message(mech: Mechanism) -> Vec<u8> {
    match mech {
        Mechanism::Plain => b"\0alice\0alice-secret".to_vec(),
        Mechanism::ScramSha256 | Mechanism::ScramSha512 => b"n,,n=alice,r=abc".to_vec(),
        Mechanism::OAuthBearer => b"n,,\x01auth=Bearer e30.e30.\x01\x01".to_vec(),
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(
        valid_first in any::<bool>(),
        messages in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 1..5),
    ) {
        for cfg in configs() {
            let mech = cfg.mechanism();
            let mut auth = authenticator(mech, &cfg, &no_credentials());
            if valid_first {
                auth.step(&first_message(mech));
            }
            for message in &messages {
                auth.step(message);
            }
        }
    }

    #[test]
    fn random_text_in_scram_final_never_panics(
        tail in "[a-zA-Z0-9=,+/]{0,120}",
    ) {
        for cfg in configs().into_iter().filter(|c| matches!(c.mechanism(), Mechanism::ScramSha256 | Mechanism::ScramSha512)) {
            let mut auth = authenticator(cfg.mechanism(), &cfg, &no_credentials());
            let Step::Challenge(server_first) = auth.step(b"n,,n=alice,r=abc") else {
                panic!("SCRAM answers a well-formed first message with a challenge");
            };
            let nonce = String::from_utf8(server_first).unwrap();
            let nonce = nonce.split(',').next().unwrap();
            let step = auth.step(format!("c=biws,{nonce},p={tail}").as_bytes());
            prop_assert!(matches!(step, Step::Failed { .. }), "{:?}", step);
        }
    }
}
