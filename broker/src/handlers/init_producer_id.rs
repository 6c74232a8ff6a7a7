//! InitProducerId (key 22) for idempotent producers. Transactions are not
//! built yet, so a transactional id gets a clear, non-retriable error.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use kafka_protocol::ResponseError;

use crate::broker::{metadata_error, Broker};

pub async fn handle(
    broker: &Broker,
    _version: i16,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    resp.ongoing_txn_producer_id = ProducerId(-1);
    resp.ongoing_txn_producer_epoch = -1;
    if req.transactional_id.is_some() {
        resp.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
        return resp;
    }
    // As in Kafka, an idempotent (non-transactional) producer always gets a
    // fresh id at epoch 0, even when it presents its old one (KIP-360).
    match broker.next_producer_id().await {
        Ok(id) => {
            resp.producer_id = ProducerId(id);
            resp.producer_epoch = 0;
        }
        Err(e) => resp.error_code = metadata_error(&e).code(),
    }
    resp
}
