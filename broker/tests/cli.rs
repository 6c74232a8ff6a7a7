//! The `broker` binary's command line: bad config is one line naming the
//! key, with exit status 2.

use std::process::Command;

#[test]
fn invalid_config_names_the_key_and_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_broker"))
        .args(["--override", "log.segment.bytes=lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("log.segment.bytes"), "{stderr}");
}

#[test]
fn unreadable_config_file_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_broker"))
        .arg("no-such-dir/server.properties")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
