//! DescribeClientQuotas: the client quotas set in the cluster, filtered as
//! Kafka's `ClientQuotasImage.describe` filters them. No quota can be set
//! yet (AlterClientQuotas is not served), so every valid filter matches
//! nothing; what this gives tools is Kafka's validation and an honest empty
//! answer. `kafka-configs.sh --describe --entity-type users` asks for quotas
//! before SCRAM credentials and fails outright on UNSUPPORTED_VERSION.

use std::collections::BTreeSet;

use kafka_protocol::messages::{DescribeClientQuotasRequest, DescribeClientQuotasResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";
const IP: &str = "ip";
const MATCH_TYPE_EXACT: i8 = 0;
const MATCH_TYPE_DEFAULT: i8 = 1;
const MATCH_TYPE_SPECIFIED: i8 = 2;

pub fn describe(req: DescribeClientQuotasRequest) -> DescribeClientQuotasResponse {
    let mut resp = DescribeClientQuotasResponse::default();
    match check_filter(&req) {
        Ok(()) => resp.entries = Some(Vec::new()),
        Err((code, message)) => {
            resp.error_code = code.code();
            resp.error_message = Some(StrBytes::from_string(message));
            resp.entries = None;
        }
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
        describe(DescribeClientQuotasRequest::default().with_components(components))
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
