//! InitProducerId (key 22): a fresh producer id for an idempotent producer,
//! or the transaction coordinator's id and epoch for a transactional one.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use crate::broker::{metadata_error, Broker};
use crate::txn::service::error_code;

pub async fn handle(
    broker: &Broker,
    version: i16,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    resp.producer_id = ProducerId(-1);
    resp.producer_epoch = -1;
    resp.ongoing_txn_producer_id = ProducerId(-1);
    resp.ongoing_txn_producer_epoch = -1;
    if let Some(id) = req.transactional_id {
        // KIP-360 (v3+): a producer recovering from an abortable error
        // presents the id and epoch it had.
        let expected = (version >= 3 && req.producer_id.0 >= 0)
            .then_some((req.producer_id.0, req.producer_epoch));
        match broker
            .txn
            .init_producer_id(broker, &id, req.transaction_timeout_ms, expected)
            .await
        {
            Ok((pid, epoch)) => {
                resp.producer_id = ProducerId(pid);
                resp.producer_epoch = epoch;
            }
            Err(e) => resp.error_code = error_code(e),
        }
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
