//! Size-prefixed framing: every request and response is a 4-byte big-endian
//! length followed by that many bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

/// Bytes of the size prefix.
pub const SIZE_PREFIX_LEN: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("negative frame size {0}")]
    NegativeSize(i32),
    /// Kafka closes the connection on this (socket.request.max.bytes).
    #[error("frame of {size_bytes} bytes exceeds the limit of {max_bytes}")]
    TooLarge { size_bytes: usize, max_bytes: usize },
}

/// The length of the frame body whose size prefix starts `buf`, once the
/// prefix is complete; `Ok(None)` while fewer than 4 bytes are buffered.
/// Checks the size before the caller reserves room for it.
pub fn frame_len(buf: &[u8], max_bytes: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..SIZE_PREFIX_LEN) else {
        return Ok(None);
    };
    let size = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if size < 0 {
        return Err(FrameError::NegativeSize(size));
    }
    let size_bytes = size as usize;
    if size_bytes > max_bytes {
        return Err(FrameError::TooLarge {
            size_bytes,
            max_bytes,
        });
    }
    Ok(Some(size_bytes))
}

/// Splits complete frames off a read buffer. Feed it what the socket
/// delivered with [`FrameDecoder::buffer_mut`], then call
/// [`FrameDecoder::next_frame`] until it returns `Ok(None)`.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: BytesMut,
    max_bytes: usize,
}

impl FrameDecoder {
    /// `max_bytes` is socket.request.max.bytes: the largest body accepted.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_bytes,
        }
    }

    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The next complete frame body (without its size prefix). After an
    /// error the connection must be closed: the stream is out of step.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        let Some(len) = frame_len(&self.buffer, self.max_bytes)? else {
            return Ok(None);
        };
        if self.buffer.len() < SIZE_PREFIX_LEN + len {
            // No reserve for the declared size: the buffer grows only with
            // bytes that actually arrive, so a 4-byte prefix cannot pin memory.
            return Ok(None);
        }
        self.buffer.advance(SIZE_PREFIX_LEN);
        Ok(Some(self.buffer.split_to(len).freeze()))
    }
}

/// Prefixes `body` with its size.
pub fn encode_frame(body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(SIZE_PREFIX_LEN + body.len());
    out.put_i32(body.len() as i32);
    out.put_slice(body);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_complete_prefix() {
        assert_eq!(frame_len(&[], 100), Ok(None));
        assert_eq!(frame_len(&[0, 0, 0], 100), Ok(None));
        assert_eq!(frame_len(&[0, 0, 0, 7, 1], 100), Ok(Some(7)));
    }

    #[test]
    fn refuses_negative_and_oversized_frames() {
        assert_eq!(
            frame_len(&(-1i32).to_be_bytes(), 100),
            Err(FrameError::NegativeSize(-1))
        );
        assert_eq!(
            frame_len(&i32::MIN.to_be_bytes(), 100),
            Err(FrameError::NegativeSize(i32::MIN))
        );
        assert_eq!(frame_len(&100i32.to_be_bytes(), 100), Ok(Some(100)));
        assert_eq!(
            frame_len(&101i32.to_be_bytes(), 100),
            Err(FrameError::TooLarge {
                size_bytes: 101,
                max_bytes: 100
            })
        );
    }

    #[test]
    fn oversized_frame_reserves_nothing() {
        let mut decoder = FrameDecoder::new(1024);
        decoder.buffer_mut().put_i32(i32::MAX);
        let capacity_before = decoder.buffer_mut().capacity();
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::TooLarge { .. })
        ));
        assert_eq!(decoder.buffer_mut().capacity(), capacity_before);
    }

    #[test]
    fn splits_frames_delivered_in_pieces() {
        let mut decoder = FrameDecoder::new(1024);
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode_frame(b"hello"));
        wire.extend_from_slice(&encode_frame(b""));
        wire.extend_from_slice(&encode_frame(b"world!"));
        let mut frames = Vec::new();
        for byte in wire {
            decoder.buffer_mut().put_u8(byte);
            while let Some(frame) = decoder.next_frame().expect("valid frames") {
                frames.push(frame);
            }
        }
        assert_eq!(frames, vec![&b"hello"[..], &b""[..], &b"world!"[..]]);
        assert!(decoder.buffer_mut().is_empty());
    }
}
