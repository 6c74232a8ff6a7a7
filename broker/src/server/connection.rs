//! One client connection. A reader task reads and decodes frames ahead (at
//! most `queued.max.requests` of them); this task executes them one at a
//! time, in order, and writes each response before starting the next.
//!
//! Executing in order is deliberate and is what Kafka does (it mutes a
//! channel while a request is in flight): an idempotent producer pipelines
//! up to five produce requests per partition and relies on them being
//! appended in the order sent.
//!
//! A response is written as its parts: encoded bytes go through one buffered
//! writer, and a Fetch response's records go from the segment files straight
//! to the socket (`sendfile` on Linux, as Kafka's `FileRecords.writeTo`), so
//! they are never copied into this process.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use protocol::fetch_response::{encode_fetch_response, Part};
use protocol::{
    decode_request, encode_response, unsupported_api_versions_response,
    unsupported_produce_response, RequestError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::broker::Broker;
use crate::handlers::fetch::FetchedRecords;
use crate::handlers::{dispatch, Reply, RequestContext};
use crate::log::FileRegion;

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
            Ok(Some(response)) => {
                write_response(&mut out, response).await?;
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

/// An encoded response: one frame, or (Fetch) the parts of one frame.
enum Outgoing {
    Frame(Bytes),
    Parts(Vec<Part<FetchedRecords>>),
}

/// Decodes, dispatches and encodes one request. `Ok(None)`: no response is
/// due (acks=0). `Err`: the connection must close.
async fn handle_frame(
    broker: &Broker,
    client_host: &str,
    body: Bytes,
) -> Result<Option<Outgoing>, ConnectionError> {
    let started = Instant::now();
    crate::fuzzing::capture_frame(&body);
    let request = match decode_request(body.clone()) {
        Ok(r) => r,
        // Produce v0-2 are advertised for librdkafka's sake and refused per
        // partition (KAFKA-18659); acks=0 still gets no answer.
        Err(RequestError::UnsupportedVersion {
            api_key: ApiKey::Produce,
            ..
        }) => return Ok(Some(Outgoing::Frame(unsupported_produce_response(&body)?))),
        Err(RequestError::UnsupportedVersion {
            api_key: ApiKey::ApiVersions,
            correlation_id,
            ..
        }) => {
            return Ok(Some(Outgoing::Frame(unsupported_api_versions_response(
                correlation_id,
            ))))
        }
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
    let encoding_failed = |e: protocol::EncodeError| {
        tracing::error!(error = %e, "response encoding failed");
        metrics::counter!("kafka_broker_request_errors_total", "api" => key_label.clone())
            .increment(1);
        ConnectionError::Io(std::io::Error::other(e.to_string()))
    };
    let result = match reply {
        Reply::Respond(resp) => encode_response(api_key, version, correlation_id, &resp)
            .map(|bytes| Some(Outgoing::Frame(bytes)))
            .map_err(encoding_failed),
        Reply::Fetch(fetch) => {
            encode_fetch_response(version, correlation_id, &fetch.response, fetch.records)
                .map(|parts| Some(Outgoing::Parts(parts)))
                .map_err(encoding_failed)
        }
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

/// Writes one response. Encoded bytes are buffered; record regions are sent
/// from their files after the buffer is flushed, so the order on the wire is
/// the parts' order.
async fn write_response(
    out: &mut BufWriter<OwnedWriteHalf>,
    response: Outgoing,
) -> std::io::Result<()> {
    let parts = match response {
        Outgoing::Frame(bytes) => return out.write_all(&bytes).await,
        Outgoing::Parts(parts) => parts,
    };
    for part in parts {
        match part {
            Part::Encoded(bytes) => out.write_all(&bytes).await?,
            Part::Records(records) => {
                out.flush().await?;
                for region in &records.regions {
                    send_region(out.get_mut(), region).await?;
                }
            }
        }
    }
    Ok(())
}

/// A region shorter on disk than when it was taken: its segment was
/// truncated (a follower cutting a diverged tail) while the response was
/// being sent. The frame's size is already on the wire, so the connection
/// closes, as Kafka's `FileRecords.writeTo` does; the client fetches again.
fn truncated_under_send() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "segment file truncated while its records were being sent",
    )
}

/// Sends a file region with `sendfile(2)`: the kernel copies from the page
/// cache to the socket. Falls back to [`copy_region`] where the file system
/// cannot (EINVAL/ENOSYS before any byte went out).
#[cfg(target_os = "linux")]
async fn send_region(out: &mut OwnedWriteHalf, region: &FileRegion) -> std::io::Result<()> {
    use tokio::io::Interest;
    // Linux sends at most 0x7ffff000 bytes per call.
    const MAX_SENDFILE: u64 = 0x7fff_f000;
    let stream: &TcpStream = out.as_ref();
    let mut offset = region.position();
    let end = region.position() + region.len();
    while offset < end {
        stream.writable().await?;
        let count = (end - offset).min(MAX_SENDFILE) as usize;
        let sent = stream.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(stream, region.file(), Some(&mut offset), count)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => return Err(truncated_under_send()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e)
                if offset == region.position()
                    && matches!(
                        rustix::io::Errno::from_io_error(&e),
                        Some(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS)
                    ) =>
            {
                return copy_region(out, region).await;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
async fn send_region(out: &mut OwnedWriteHalf, region: &FileRegion) -> std::io::Result<()> {
    copy_region(out, region).await
}

/// Sends a file region through a bounded buffer: read a piece, write it.
async fn copy_region<W: tokio::io::AsyncWrite + Unpin>(
    out: &mut W,
    region: &FileRegion,
) -> std::io::Result<()> {
    const PIECE_BYTES: u64 = 64 * 1024;
    let mut buf = vec![0u8; region.len().min(PIECE_BYTES) as usize];
    let mut done = 0u64;
    while done < region.len() {
        let n = (region.len() - done).min(PIECE_BYTES) as usize;
        region
            .read_exact_at(&mut buf[..n], done)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => truncated_under_send(),
                _ => e,
            })?;
        out.write_all(&buf[..n]).await?;
        done += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A connected pair: the broker's write half, and the client's stream.
    async fn connected() -> (OwnedWriteHalf, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_, write) = server.into_split();
        (write, client)
    }

    fn file_with(len: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        (f, bytes)
    }

    /// Sends the region with `how`, then closes, and returns what the client
    /// read and what the send returned.
    async fn send_with(region: FileRegion, sendfile: bool) -> (Vec<u8>, std::io::Result<()>) {
        let (mut write, mut client) = connected().await;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        let sent = if sendfile {
            send_region(&mut write, &region).await
        } else {
            copy_region(&mut write, &region).await
        };
        drop(write);
        (reader.await.unwrap(), sent)
    }

    #[tokio::test]
    async fn a_region_goes_out_byte_for_byte_either_way() {
        // Larger than a socket buffer, so the send meets a full socket.
        let (f, bytes) = file_with(3 << 20);
        let file = Arc::new(f.reopen().unwrap());
        for sendfile in [true, false] {
            let region = FileRegion::new(file.clone(), 1000, 2 << 20);
            let (got, sent) = send_with(region, sendfile).await;
            sent.unwrap();
            assert!(got == bytes[1000..1000 + (2 << 20)], "sendfile {sendfile}");
        }
    }

    #[tokio::test]
    async fn a_region_truncated_under_the_send_fails_the_connection() {
        for sendfile in [true, false] {
            let (f, bytes) = file_with(300_000);
            let file = Arc::new(f.reopen().unwrap());
            let region = FileRegion::new(file.clone(), 1000, 200_000);
            file.set_len(51_000).unwrap();
            let (got, sent) = send_with(region, sendfile).await;
            let e = sent.expect_err("a short file cannot fill the frame");
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
            // Only bytes of the region went out, never anything else.
            assert!(got.len() <= 50_000);
            assert!(got == bytes[1000..1000 + got.len()], "sendfile {sendfile}");
        }
    }
}
