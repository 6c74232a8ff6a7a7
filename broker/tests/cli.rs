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

/// The binary serves Prometheus metrics on `metrics.listen.address`, with
/// per-API request counters once a request has been handled.
#[test]
fn metrics_are_served_on_their_own_port() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (port, metrics_port) = (free(), free());
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_broker"))
        .args([
            "--override",
            &format!("listeners=PLAINTEXT://127.0.0.1:{port}"),
            "--override",
            &format!("log.dirs={}", dir.path().display()),
            "--override",
            &format!("metrics.listen.address=127.0.0.1:{metrics_port}"),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // ApiVersions v0 with correlation id 1 and a null client id.
    let request = [0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff];
    let mut answered = false;
    while !answered && Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(&request).unwrap();
            let mut size = [0u8; 4];
            answered = s.read_exact(&mut size).is_ok();
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(answered, "broker did not answer ApiVersions within 30 s");
    let mut body = String::new();
    let mut s = TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    s.read_to_string(&mut body).unwrap();
    child.kill().ok();
    child.wait().ok();
    assert!(
        body.starts_with("HTTP/1.1 200") || body.starts_with("HTTP/1.0 200"),
        "{body}"
    );
    assert!(body.contains("kafka_broker_requests_total"), "{body}");
    assert!(body.contains("api=\"ApiVersions\""), "{body}");
}
