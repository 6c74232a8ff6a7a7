//! The dispatcher sidecar (issue 7). Until it is built, the binary says so and
//! exits non-zero, so nobody mistakes it for a working dispatcher.
fn main() {
    eprintln!("dispatcher: not built yet (see issue 7)");
    std::process::exit(2);
}
