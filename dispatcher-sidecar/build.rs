//! Generates the gRPC service and messages from `proto/dispatcher.proto`.
//! protoc comes from `protoc-bin-vendored`, so a build needs no system
//! protoc; a `PROTOC` already set in the environment wins.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    println!("cargo:rerun-if-changed=proto/dispatcher.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    // A delivery's key and payload are `Bytes`, shared with the record the
    // dispatcher holds, so answering a receive copies each payload once.
    tonic_prost_build::configure()
        .bytes(".dispatcher.v1.Delivery.key")
        .bytes(".dispatcher.v1.Delivery.payload")
        .compile_protos(&["proto/dispatcher.proto"], &["proto"])?;
    Ok(())
}
