//! DescribeClientQuotas and AlterClientQuotas: client quotas kept in the
//! metadata quorum, as Kafka's `ClientQuotaControlManager` keeps them and
//! `ClientQuotasImage.describe` filters them
//! (`kafka-configs.sh --alter --add-config 'producer_byte_rate=1024'
//! --entity-type users --entity-name alice`).

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlterEntityData, EntryData as AlterEntryData,
};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::broker::{metadata_error, Broker};
use crate::metadata::{
    ClientQuotaAlteration, ClientQuotaEntity, MetadataCommand, MetadataImage, QuotaEntityName,
    QuotaValue,
};
use crate::quota::{CLIENT_QUOTA_KEYS, IP_QUOTA_KEYS};

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";
const IP: &str = "ip";
const MATCH_TYPE_EXACT: i8 = 0;
const MATCH_TYPE_DEFAULT: i8 = 1;
const MATCH_TYPE_SPECIFIED: i8 = 2;

pub fn describe(broker: &Broker, req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    describe_image(&broker.metadata.image(), req)
}

fn describe_image(
    image: &MetadataImage,
    req: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let mut resp = DescribeClientQuotasResponse::default();
    if let Err((code, message)) = check_filter(&req) {
        resp.error_code = code.code();
        resp.error_message = Some(StrBytes::from_string(message));
        resp.entries = None;
        return resp;
    }
    let entries = image
        .client_quotas
        .iter()
        .filter(|(entity, _)| matches(entity, &req))
        .map(|(entity, values)| {
            EntryData::default()
                .with_entity(
                    parts(entity)
                        .into_iter()
                        .map(|(t, name)| {
                            EntityData::default()
                                .with_entity_type(StrBytes::from_static_str(t))
                                .with_entity_name(
                                    name.as_wire().map(|n| StrBytes::from_string(n.to_string())),
                                )
                        })
                        .collect(),
                )
                .with_values(
                    values
                        .iter()
                        .map(|(k, v)| {
                            ValueData::default()
                                .with_key(StrBytes::from_string(k.clone()))
                                .with_value(v.0)
                        })
                        .collect(),
                )
        })
        .collect();
    resp.entries = Some(entries);
    resp
}

/// An entity's parts as (entity type, name).
fn parts(entity: &ClientQuotaEntity) -> Vec<(&'static str, &QuotaEntityName)> {
    [
        (USER, entity.user.as_ref()),
        (CLIENT_ID, entity.client_id.as_ref()),
        (IP, entity.ip.as_ref()),
    ]
    .into_iter()
    .filter_map(|(t, n)| n.map(|n| (t, n)))
    .collect()
}

fn part<'a>(entity: &'a ClientQuotaEntity, entity_type: &str) -> Option<&'a QuotaEntityName> {
    match entity_type {
        USER => entity.user.as_ref(),
        CLIENT_ID => entity.client_id.as_ref(),
        IP => entity.ip.as_ref(),
        _ => None,
    }
}

/// `ClientQuotasImage.describe`'s matching (the filter already checked):
/// exact and default components must equal the entity's part, specified
/// ones need the part present (named or default); with no component every
/// entity matches unless strict; strict also wants no other parts.
fn matches(entity: &ClientQuotaEntity, req: &DescribeClientQuotasRequest) -> bool {
    if req.components.is_empty() {
        return !req.strict;
    }
    for c in &req.components {
        let have = part(entity, c.entity_type.as_str());
        let ok = match c.match_type {
            MATCH_TYPE_EXACT => {
                have.and_then(|n| n.as_wire()) == c._match.as_ref().map(|m| m.as_str())
                    && have.is_some()
            }
            MATCH_TYPE_DEFAULT => have == Some(&QuotaEntityName::Default),
            _ => have.is_some(),
        };
        if !ok {
            return false;
        }
    }
    !req.strict || parts(entity).len() == req.components.len()
}

type Refusal = (ResponseError, String);

/// The keys an entity may set, each with whether it must be whole.
type QuotaKeys = &'static [(&'static str, bool)];

/// An entity as the request named it: (entity type, name or default).
type WireEntity = Vec<(String, Option<String>)>;

fn invalid(message: String) -> Refusal {
    (ResponseError::InvalidRequest, message)
}

/// The entity of one alteration, checked as Kafka's `validateEntity` and
/// `configKeysForEntityType`, with the keys it may set.
fn check_entity(
    entity: &[kafka_protocol::messages::alter_client_quotas_request::EntityData],
) -> Result<(ClientQuotaEntity, QuotaKeys), Refusal> {
    if entity.is_empty() {
        return Err(invalid("Invalid empty client quota entity".into()));
    }
    let mut e = ClientQuotaEntity::default();
    for part in entity {
        let t = part.entity_type.as_str();
        let name = part.entity_name.as_ref().map(|n| n.as_str());
        let slot = match t {
            USER => &mut e.user,
            CLIENT_ID => &mut e.client_id,
            IP => &mut e.ip,
            other => {
                return Err(invalid(format!(
                    "Unhandled client quota entity type: {other}"
                )))
            }
        };
        if slot.is_some() {
            return Err(invalid(format!(
                "Invalid empty client quota entity, duplicate entity entry {t}"
            )));
        }
        if name == Some("") {
            return Err(invalid(format!("Empty {t} not supported")));
        }
        *slot = Some(QuotaEntityName::from_wire(name));
    }
    let keys = match (&e.user, &e.client_id, &e.ip) {
        (Some(_), _, None) | (None, Some(_), None) => CLIENT_QUOTA_KEYS,
        (None, None, Some(ip)) => {
            if let QuotaEntityName::Named(ip) = ip {
                if ip.parse::<std::net::IpAddr>().is_err() {
                    return Err(invalid(format!(
                        "{ip} is not a valid IP or resolvable host."
                    )));
                }
            }
            IP_QUOTA_KEYS
        }
        _ => return Err(invalid("Invalid empty client quota entity".into())),
    };
    Ok((e, keys))
}

/// One alteration's key and value, as Kafka's `validateQuotaKeyValue`:
/// known keys only; whole numbers where the key is a Long. We also refuse
/// NaN, infinities and values below zero, which no rate can mean.
fn check_value(keys: &[(&str, bool)], key: &str, value: f64) -> Result<(), Refusal> {
    let Some((_, whole)) = keys.iter().find(|(k, _)| *k == key) else {
        return Err(invalid(format!("Invalid configuration key {key}")));
    };
    if !value.is_finite() || value < 0.0 {
        return Err(invalid(format!(
            "Configuration {key} must be a non-negative number"
        )));
    }
    if *whole {
        let epsilon = 1e-6;
        if ((value + epsilon).trunc() - value).abs() > epsilon {
            return Err(invalid(format!("Configuration {key} must be a Long value")));
        }
    }
    Ok(())
}

pub async fn alter(broker: &Broker, req: AlterClientQuotasRequest) -> AlterClientQuotasResponse {
    let image = broker.metadata.image();
    let mut results: Vec<(WireEntity, Result<(), Refusal>)> = Vec::new();
    let mut alterations: Vec<ClientQuotaAlteration> = Vec::new();
    let mut seen: BTreeSet<ClientQuotaEntity> = BTreeSet::new();
    for entry in &req.entries {
        let wire_entity: WireEntity = entry
            .entity
            .iter()
            .map(|p| {
                (
                    p.entity_type.to_string(),
                    p.entity_name.as_ref().map(|n| n.to_string()),
                )
            })
            .collect();
        let checked = (|| {
            let mut ops: BTreeMap<String, Option<QuotaValue>> = BTreeMap::new();
            let (entity, keys) = check_entity(&entry.entity)?;
            if !seen.insert(entity.clone()) {
                return Err(invalid(format!(
                    "Ignoring duplicate entity {wire_entity:?}"
                )));
            }
            for op in &entry.ops {
                let key = op.key.to_string();
                if ops.contains_key(&key) {
                    return Err(invalid(format!(
                        "Duplicate quota key {key} not updating quota for this entity"
                    )));
                }
                let value = if op.remove {
                    None
                } else {
                    check_value(keys, &key, op.value)?;
                    Some(QuotaValue(op.value))
                };
                ops.insert(key, value);
            }
            // Only what changes is written: removing an absent key or
            // setting the value a key has is no record.
            let current = image.client_quotas.get(&entity);
            let ops: Vec<_> = ops
                .into_iter()
                .filter(|(k, v)| current.and_then(|c| c.get(k)).copied() != *v)
                .collect();
            Ok((entity, ops))
        })();
        match checked {
            Ok((entity, ops)) => {
                if !ops.is_empty() {
                    alterations.push((entity, ops));
                }
                results.push((wire_entity, Ok(())));
            }
            Err(e) => results.push((wire_entity, Err(e))),
        }
    }
    let mut outcome: Result<(), (ResponseError, String)> = Ok(());
    if !req.validate_only && !alterations.is_empty() {
        let n = alterations.len();
        if let Err(e) = broker
            .metadata
            .propose(MetadataCommand::AlterClientQuotas { alterations })
            .await
        {
            outcome = Err((metadata_error(&e), e.to_string()));
        } else {
            tracing::info!(entities = n, "altered client quotas");
        }
    }
    let mut resp = AlterClientQuotasResponse::default();
    for (entity, result) in results {
        let result = result.and_then(|()| outcome.clone());
        let (code, message) = match result {
            Ok(()) => (0, None),
            Err((code, message)) => (code.code(), Some(StrBytes::from_string(message))),
        };
        resp.entries.push(
            AlterEntryData::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_entity(
                    entity
                        .into_iter()
                        .map(|(t, n)| {
                            AlterEntityData::default()
                                .with_entity_type(StrBytes::from_string(t))
                                .with_entity_name(n.map(StrBytes::from_string))
                        })
                        .collect(),
                ),
        );
    }
    resp
}

/// Kafka's checks of the filter, with its errors and messages.
fn check_filter(req: &DescribeClientQuotasRequest) -> Result<(), (ResponseError, String)> {
    let invalid = |m: String| Err((ResponseError::InvalidRequest, m));
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for c in &req.components {
        let entity_type = c.entity_type.as_str();
        if entity_type.is_empty() {
            return invalid("Invalid empty entity type.".into());
        }
        if !seen.insert(entity_type) {
            return invalid(format!(
                "Entity type {entity_type} cannot appear more than once in the filter."
            ));
        }
        if ![IP, USER, CLIENT_ID].contains(&entity_type) {
            return Err((
                ResponseError::UnsupportedVersion,
                format!("Unsupported entity type {entity_type}"),
            ));
        }
        match (c.match_type, c._match.is_some()) {
            (MATCH_TYPE_EXACT, false) => {
                return invalid(
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                )
            }
            (MATCH_TYPE_DEFAULT, true) => {
                return invalid(
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                        .into(),
                )
            }
            (MATCH_TYPE_SPECIFIED, true) => {
                return invalid(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                        .into(),
                )
            }
            (MATCH_TYPE_EXACT | MATCH_TYPE_DEFAULT | MATCH_TYPE_SPECIFIED, _) => {}
            (other, _) => return invalid(format!("Unknown match type {other}")),
        }
    }
    if seen.contains(IP) && (seen.contains(USER) || seen.contains(CLIENT_ID)) {
        return invalid(
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component."
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::describe_client_quotas_request::ComponentData;

    use super::*;

    fn component(entity_type: &str, match_type: i8, name: Option<&str>) -> ComponentData {
        ComponentData::default()
            .with_entity_type(StrBytes::from_string(entity_type.to_string()))
            .with_match_type(match_type)
            .with_match(name.map(|n| StrBytes::from_string(n.to_string())))
    }

    fn ask(components: Vec<ComponentData>) -> DescribeClientQuotasResponse {
        describe_image(
            &MetadataImage::default(),
            DescribeClientQuotasRequest::default().with_components(components),
        )
    }

    #[test]
    fn valid_filters_match_the_empty_quota_set() {
        for components in [
            vec![],
            vec![component(USER, MATCH_TYPE_EXACT, Some("alice"))],
            vec![
                component(USER, MATCH_TYPE_DEFAULT, None),
                component(CLIENT_ID, MATCH_TYPE_SPECIFIED, None),
            ],
            vec![component(IP, MATCH_TYPE_SPECIFIED, None)],
        ] {
            let r = ask(components);
            assert_eq!(r.error_code, 0);
            assert_eq!(r.entries, Some(vec![]));
        }
    }

    #[test]
    fn invalid_filters_get_kafkas_errors() {
        let cases = [
            (
                vec![component("", MATCH_TYPE_SPECIFIED, None)],
                ResponseError::InvalidRequest,
            ),
            (
                vec![
                    component(USER, MATCH_TYPE_SPECIFIED, None),
                    component(USER, MATCH_TYPE_DEFAULT, None),
                ],
                ResponseError::InvalidRequest,
            ),
            (
                vec![component("group", MATCH_TYPE_SPECIFIED, None)],
                ResponseError::UnsupportedVersion,
            ),
            (
                vec![component(USER, MATCH_TYPE_EXACT, None)],
                ResponseError::InvalidRequest,
            ),
            (
                vec![component(USER, MATCH_TYPE_DEFAULT, Some("a"))],
                ResponseError::InvalidRequest,
            ),
            (
                vec![component(USER, 7, None)],
                ResponseError::InvalidRequest,
            ),
            (
                vec![
                    component(IP, MATCH_TYPE_SPECIFIED, None),
                    component(USER, MATCH_TYPE_SPECIFIED, None),
                ],
                ResponseError::InvalidRequest,
            ),
        ];
        for (components, code) in cases {
            let r = ask(components);
            assert_eq!(r.error_code, code.code(), "{:?}", r.error_message);
            assert!(r.entries.is_none());
        }
    }
}
