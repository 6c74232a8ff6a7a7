//! One client connection. A reader task reads and decodes frames ahead (at
//! most `queued.max.requests` of them); this task executes them one at a
//! time, in order, and writes each response before starting the next.
//!
//! Executing in order is deliberate and is what Kafka does (it mutes a
//! channel while a request is in flight): an idempotent producer pipelines
//! up to five produce requests per partition and relies on them being
//! appended in the order sent.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use protocol::{
    decode_request, encode_response, unsupported_api_versions_response,
    unsupported_produce_response, RequestError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::broker::Broker;
use crate::handlers::{dispatch, Reply, RequestContext};

/// A frame read off the socket, holding its share of the memory budget.
struct Frame {
    body: Bytes,
    _permit: OwnedSemaphorePermit,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes exceeds socket.request.max.bytes")]
    FrameTooLarge(i64),
    #[error(transparent)]
    Request(#[from] RequestError),
}

pub async fn run(
    broker: Arc<Broker>,
    stream: TcpStream,
    memory: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let client_host = stream
        .peer_addr()
        .map(|a| format!("/{}", a.ip()))
        .unwrap_or_default();
    let (read_half, write_half) = stream.into_split();
    let (tx, mut rx) =
        mpsc::channel::<Result<Frame, ConnectionError>>(broker.config.queued_max_requests);
    let max_bytes = broker.config.socket_request_max_bytes;
    let reader = tokio::spawn(read_frames(read_half, tx, max_bytes, memory));
    let mut out = BufWriter::with_capacity(64 * 1024, write_half);
    let result = loop {
        let frame = tokio::select! {
            f = rx.recv() => f,
            _ = shutdown.changed() => break Ok(()),
        };
        let frame = match frame {
            None => break Ok(()),
            Some(Err(e)) => break Err(e),
            Some(Ok(f)) => f,
        };
        match handle_frame(&broker, &client_host, frame.body).await {
            Ok(Some(bytes)) => {
                out.write_all(&bytes).await?;
                // Flush unless more requests are already waiting: their
                // responses then go out in one write.
                if rx.is_empty() {
                    out.flush().await?;
                }
            }
            Ok(None) => {}
            Err(e) => {
                out.flush().await.ok();
                break Err(e);
            }
        }
    };
    reader.abort();
    result
}

/// Reads size-prefixed frames. The size is checked against
/// `socket.request.max.bytes` and memory permits are taken before the body
/// is allocated.
async fn read_frames(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    tx: mpsc::Sender<Result<Frame, ConnectionError>>,
    max_bytes: usize,
    memory: Arc<Semaphore>,
) {
    loop {
        let size = match rd.read_i32().await {
            Ok(s) => s as i64,
            Err(_) => return,
        };
        if size < 0 || size as usize > max_bytes {
            let _ = tx.send(Err(ConnectionError::FrameTooLarge(size))).await;
            return;
        }
        let kib = (size as usize).div_ceil(1024).max(1) as u32;
        let Ok(permit) = memory.clone().acquire_many_owned(kib).await else {
            return;
        };
        // Read into spare capacity: zeroing the buffer first (read_exact
        // into `BytesMut::zeroed`) cost a memset of every request byte, 5% of
        // the broker's CPU under produce load.
        let size = size as usize;
        let mut body = BytesMut::with_capacity(size);
        let mut limited = (&mut rd).take(size as u64);
        while body.len() < size {
            match limited.read_buf(&mut body).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let frame = Frame {
            body: body.freeze(),
            _permit: permit,
        };
        if tx.send(Ok(frame)).await.is_err() {
            return;
        }
    }
}

/// Decodes, dispatches and encodes one request. `Ok(None)`: no response is
/// due (acks=0). `Err`: the connection must close.
async fn handle_frame(
    broker: &Broker,
    client_host: &str,
    body: Bytes,
) -> Result<Option<Bytes>, ConnectionError> {
    let started = Instant::now();
    crate::fuzzing::capture_frame(&body);
    let request = match decode_request(body.clone()) {
        Ok(r) => r,
        // Produce v0-2 are advertised for librdkafka's sake and refused per
        // partition (KAFKA-18659); acks=0 still gets no answer.
        Err(RequestError::UnsupportedVersion {
            api_key: ApiKey::Produce,
            ..
        }) => return Ok(unsupported_produce_response(&body).map(Some)?),
        Err(RequestError::UnsupportedVersion {
            api_key: ApiKey::ApiVersions,
            correlation_id,
            ..
        }) => return Ok(Some(unsupported_api_versions_response(correlation_id))),
        Err(e) => {
            metrics::counter!("kafka_broker_malformed_requests_total").increment(1);
            tracing::info!(error = %e, "closing connection on a request we cannot answer");
            return Err(e.into());
        }
    };
    let api_key = ApiKey::try_from(request.api_key()).expect("decoded requests have known keys");
    let version = request.api_version();
    let correlation_id = request.correlation_id();
    let key_label = format!("{api_key:?}");
    let ctx = RequestContext {
        client_id: request
            .header
            .client_id
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default(),
        client_host: client_host.to_string(),
    };
    let reply = dispatch(broker, &ctx, version, request.body).await;
    let result = match reply {
        Reply::Respond(resp) => match encode_response(api_key, version, correlation_id, &resp) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) => {
                tracing::error!(error = %e, "response encoding failed");
                metrics::counter!("kafka_broker_request_errors_total", "api" => key_label.clone())
                    .increment(1);
                Err(ConnectionError::Io(std::io::Error::other(e.to_string())))
            }
        },
        Reply::NoResponse => Ok(None),
        Reply::Unsupported => Err(ConnectionError::Io(std::io::Error::other(format!(
            "{api_key:?} reached dispatch but has no handler"
        )))),
    };
    metrics::counter!("kafka_broker_requests_total", "api" => key_label.clone(), "version" => version.to_string())
        .increment(1);
    metrics::histogram!("kafka_broker_request_latency_seconds", "api" => key_label)
        .record(started.elapsed().as_secs_f64());
    result
}
