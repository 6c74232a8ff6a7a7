//! The gRPC codec of both protos: tonic-prost's, except that a message is
//! encoded into a buffer reserved at its encoded length. tonic starts each
//! answer in an 8 KiB buffer, so a receive's answer of 100 KiB of payloads
//! grew it five times, copying what was already encoded each time and
//! touching fresh memory for every new size. (tonic's buffers can only be
//! made inside tonic, so the gRPC tests in `tests/api.rs` and
//! `tests/push.rs` are what exercise this codec.)

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// Named by `codec_path` in `build.rs`; generated code makes one per call.
#[derive(Debug)]
pub struct SizedCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        SizedCodec(PhantomData)
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Encodes `T` into room reserved for all of it.
#[derive(Debug)]
pub struct SizedEncoder<T>(PhantomData<fn() -> T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding the answer: {e}")))
    }
}
