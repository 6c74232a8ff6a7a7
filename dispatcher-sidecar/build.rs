//! Generates the gRPC services and messages from `proto/dispatcher.proto`
//! (the pull API) and `proto/push.proto` (what a push endpoint implements:
//! the dispatcher uses its client, tests and Rust subscribers its server).
//! protoc comes from `protoc-bin-vendored`, so a build needs no system
//! protoc; a `PROTOC` already set in the environment wins.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/dispatcher.proto");
    println!("cargo:rerun-if-changed=proto/push.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    // A delivery's key and payload are `Bytes`, shared with the record the
    // dispatcher holds, so answering a receive or pushing copies each
    // payload once.
    // `SizedCodec` encodes each message into room reserved for all of it.
    tonic_prost_build::configure()
        .codec_path("crate::api::codec::SizedCodec")
        .bytes(".dispatcher.v1.Delivery.key")
        .bytes(".dispatcher.v1.Delivery.payload")
        .bytes(".dispatcher.push.v1.PushRequest.key")
        .bytes(".dispatcher.push.v1.PushRequest.payload")
        .compile_protos(&["proto/dispatcher.proto", "proto/push.proto"], &["proto"])?;
    Ok(())
}
