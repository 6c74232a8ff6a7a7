//! The two transports a connection runs over: plain TCP, whose reads are
//! charged to the memory budget only once bytes are in the socket and whose
//! Fetch records go out with `sendfile`, and TLS, which decrypts into a
//! fixed per-connection buffer (so a waiting client holds no budget either)
//! and sends records through the cipher, as Kafka's SSL transport does.

use std::future::Future;
use std::io;

use bytes::BufMut;
use tokio::io::{AsyncBufRead, AsyncReadExt, BufReader, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::log::FileRegion;

/// Where a connection's requests come from.
pub(super) trait ReadSource: Send + 'static {
    /// Reads what is there into `buf`, waiting for at least one byte (0 at
    /// the end of the stream).
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a;

    /// Waits until a read would not block.
    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_;

    /// Reads without waiting: `WouldBlock` when nothing is there.
    fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize>;

    /// Fills `buf` or fails with `UnexpectedEof`.
    fn read_exact<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        async move {
            let mut done = 0;
            while done < buf.len() {
                match self.read(&mut buf[done..]).await? {
                    0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                    n => done += n,
                }
            }
            Ok(())
        }
    }
}

impl ReadSource for OwnedReadHalf {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        AsyncReadExt::read(self, buf)
    }

    fn readable(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        OwnedReadHalf::readable(self)
    }

    fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        OwnedReadHalf::try_read_buf(self, buf)
    }
}

/// The size of a TLS connection's plaintext buffer: one TLS record.
const TLS_READ_BUFFER: usize = 16 * 1024;

/// A TLS connection's read side, decrypted into a buffer of its own.
pub(super) struct TlsSource {
    inner: BufReader<ReadHalf<TlsStream<TcpStream>>>,
    eof: bool,
}

impl TlsSource {
    pub(super) fn new(read: ReadHalf<TlsStream<TcpStream>>) -> Self {
        Self {
            inner: BufReader::with_capacity(TLS_READ_BUFFER, read),
            eof: false,
        }
    }
}

impl ReadSource for TlsSource {
    fn read<'a>(
        &'a mut self,
        buf: &'a mut [u8],
    ) -> impl Future<Output = io::Result<usize>> + Send + 'a {
        AsyncReadExt::read(&mut self.inner, buf)
    }

    async fn readable(&mut self) -> io::Result<()> {
        if self.inner.buffer().is_empty() && !self.eof {
            let filled = std::future::poll_fn(|cx| {
                std::pin::Pin::new(&mut self.inner)
                    .poll_fill_buf(cx)
                    .map_ok(|b| b.len())
            })
            .await?;
            self.eof = filled == 0;
        }
        Ok(())
    }

    fn try_read_buf<B: BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        let available = self.inner.buffer();
        if available.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = available.len().min(buf.remaining_mut());
        buf.put_slice(&available[..n]);
        std::pin::Pin::new(&mut self.inner).consume(n);
        Ok(n)
    }
}

/// Where a connection's responses go; Fetch records are sent from their
/// segment files by `send_region`.
pub(super) trait ResponseSink: tokio::io::AsyncWrite + Unpin + Send + 'static {
    fn send_region<'a>(
        &'a mut self,
        region: &'a FileRegion,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;
}

impl ResponseSink for OwnedWriteHalf {
    fn send_region<'a>(
        &'a mut self,
        region: &'a FileRegion,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        super::connection::send_region(self, region)
    }
}

impl ResponseSink for WriteHalf<TlsStream<TcpStream>> {
    fn send_region<'a>(
        &'a mut self,
        region: &'a FileRegion,
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        super::connection::copy_region(self, region)
    }
}
