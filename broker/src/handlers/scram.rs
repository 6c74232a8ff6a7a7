//! AlterUserScramCredentials and DescribeUserScramCredentials: SCRAM users
//! kept in the metadata quorum, as Kafka's `ScramControlManager` keeps
//! them (`kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[password=...]'
//! --entity-type users --entity-name alice`). The client salts and hashes
//! the password; only the salted password crosses the wire, and the quorum
//! stores the StoredKey and ServerKey derived from it.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::broker::{metadata_error, Broker};
use crate::metadata::{MetadataCommand, StoredScramCredential};
use crate::security::sasl::{ScramCredential, ScramMechanism};

type Refusal = (ResponseError, String);

fn mechanism(user: &str, kind: i8) -> Result<ScramMechanism, Refusal> {
    if user.is_empty() {
        return Err((
            ResponseError::UnacceptableCredential,
            "Username must not be empty".into(),
        ));
    }
    ScramMechanism::from_type_id(kind).ok_or_else(|| {
        (
            ResponseError::UnsupportedSaslMechanism,
            "Unknown SCRAM mechanism".into(),
        )
    })
}

pub async fn alter(
    broker: &Broker,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let image = broker.metadata.image();
    // Kafka's rules: one alteration per user per request (a second one
    // fails that user with DUPLICATE_RESOURCE); each alteration is checked
    // on its own; the valid ones are written together.
    let mut errors: BTreeMap<String, Refusal> = BTreeMap::new();
    let mut deletions: BTreeMap<String, i8> = BTreeMap::new();
    let mut upserts: BTreeMap<String, (i8, StoredScramCredential)> = BTreeMap::new();
    let duplicate = || {
        (
            ResponseError::DuplicateResource,
            "A user credential cannot be altered twice in the same request".to_string(),
        )
    };
    for d in &req.deletions {
        let user = d.name.to_string();
        if errors.contains_key(&user) {
            continue;
        }
        if deletions.remove(&user).is_some() {
            errors.insert(user, duplicate());
            continue;
        }
        let checked = mechanism(&user, d.mechanism).and_then(|_| {
            let exists = image
                .scram_credentials
                .get(&user)
                .is_some_and(|m| m.contains_key(&d.mechanism));
            if exists {
                Ok(())
            } else {
                Err((
                    ResponseError::ResourceNotFound,
                    "Attempt to delete a user credential that does not exist".into(),
                ))
            }
        });
        match checked {
            Ok(()) => {
                deletions.insert(user, d.mechanism);
            }
            Err(e) => {
                errors.insert(user, e);
            }
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        if errors.contains_key(&user) {
            continue;
        }
        if deletions.remove(&user).is_some() || upserts.remove(&user).is_some() {
            errors.insert(user, duplicate());
            continue;
        }
        let checked = mechanism(&user, u.mechanism).and_then(|m| {
            if u.iterations < ScramMechanism::MIN_ITERATIONS {
                return Err((
                    ResponseError::UnacceptableCredential,
                    "Too few iterations".into(),
                ));
            }
            if u.iterations > ScramMechanism::MAX_ITERATIONS {
                return Err((
                    ResponseError::UnacceptableCredential,
                    "Too many iterations".into(),
                ));
            }
            if u.salt.is_empty() || u.salted_password.is_empty() {
                return Err((
                    ResponseError::UnacceptableCredential,
                    "Salt and salted password must not be empty".into(),
                ));
            }
            let c =
                ScramCredential::from_salted_password(m, &u.salted_password, &u.salt, u.iterations);
            Ok(StoredScramCredential {
                salt: c.salt,
                stored_key: c.stored_key,
                server_key: c.server_key,
                iterations: c.iterations,
            })
        });
        match checked {
            Ok(stored) => {
                upserts.insert(user, (u.mechanism, stored));
            }
            Err(e) => {
                errors.insert(user, e);
            }
        }
    }
    let mut resp = AlterUserScramCredentialsResponse::default();
    let written: Vec<String> = deletions.keys().chain(upserts.keys()).cloned().collect();
    if !written.is_empty() {
        let command = MetadataCommand::AlterScramCredentials {
            delete: deletions.into_iter().collect(),
            upsert: upserts
                .into_iter()
                .map(|(user, (m, c))| (user, m, c))
                .collect(),
        };
        let outcome = broker.metadata.propose(command).await;
        for user in written {
            let (code, message) = match &outcome {
                Ok(_) => {
                    tracing::info!(%user, "altered SCRAM credentials");
                    (0, None)
                }
                Err(e) => (
                    metadata_error(e).code(),
                    Some(StrBytes::from_string(e.to_string())),
                ),
            };
            resp.results.push(
                AlterUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user))
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
    }
    for (user, (code, message)) in errors {
        resp.results.push(
            AlterUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(user))
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message))),
        );
    }
    resp
}

pub fn describe(
    broker: &Broker,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let image = broker.metadata.image();
    let describe_one = |user: &str| -> DescribeUserScramCredentialsResult {
        let mut r = DescribeUserScramCredentialsResult::default()
            .with_user(StrBytes::from_string(user.to_string()));
        match image.scram_credentials.get(user) {
            Some(by_mechanism) => {
                r.credential_infos = by_mechanism
                    .iter()
                    .map(|(m, c)| {
                        CredentialInfo::default()
                            .with_mechanism(*m)
                            .with_iterations(c.iterations)
                    })
                    .collect();
            }
            None => {
                r.error_code = ResponseError::ResourceNotFound.code();
                r.error_message = Some(StrBytes::from_string(format!(
                    "Attempt to describe nonexistent user: {user}"
                )));
            }
        }
        r
    };
    let mut resp = DescribeUserScramCredentialsResponse::default();
    match req.users.filter(|u| !u.is_empty()) {
        // Null or empty: every user.
        None => {
            resp.results = image
                .scram_credentials
                .keys()
                .map(|u| describe_one(u))
                .collect();
        }
        Some(users) => {
            let mut seen = BTreeSet::new();
            let mut duplicates = BTreeSet::new();
            for u in &users {
                if !seen.insert(u.name.to_string()) {
                    duplicates.insert(u.name.to_string());
                }
            }
            for user in seen {
                if duplicates.contains(&user) {
                    resp.results.push(
                        DescribeUserScramCredentialsResult::default()
                            .with_user(StrBytes::from_string(user.clone()))
                            .with_error_code(ResponseError::DuplicateResource.code())
                            .with_error_message(Some(StrBytes::from_string(format!(
                                "Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
                            )))),
                    );
                } else {
                    resp.results.push(describe_one(&user));
                }
            }
        }
    }
    resp
}
