//! ApiVersions (key 18): generated from the one table of supported versions.

use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

pub fn handle(_version: i16, _req: ApiVersionsRequest) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.api_keys = protocol::versions::api_versions_keys();
    resp
}
