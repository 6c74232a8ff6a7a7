//! Kafka wire layer. Bytes in, typed requests out; typed responses in, bytes
//! out. Invariant: this crate knows nothing about tokio, sockets or clocks.
//!
//! - [`frame`]: size-prefixed framing with the socket.request.max.bytes limit.
//! - [`versions`]: the one table of served APIs and versions.
//! - [`guard`]: refuses bodies whose declared counts exceed their bytes,
//!   before kafka-protocol allocates from those counts.
//! - [`header`]: [`decode_request`] and [`encode_response`].
//! - [`newer`]: versions newer than kafka-protocol's, as the version below
//!   plus their extra fields.
//! - [`fetch_response`]: Fetch responses as parts, the record data supplied
//!   (and sent) by the caller instead of copied into the response.
//! - [`record_batch`]: a zero-copy view of v2 record batches.
//! - [`records`]: streaming reads of the records inside a batch, in memory
//!   bounded by the codecs' windows.

pub mod fetch_response;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod guard;
pub mod header;
pub mod newer;
pub mod record_batch;
pub mod records;
pub mod versions;

pub use header::{
    check_request, decode_request, encode_response, unsupported_api_versions_response,
    unsupported_produce_response, CheckedRequest, EncodeError, Request, RequestError,
};
pub use kafka_protocol;
