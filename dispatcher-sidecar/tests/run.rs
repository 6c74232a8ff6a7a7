//! The binary end to end: `dispatcher --config` against our broker sets up
//! the queue's topics, joins the group, and leaves cleanly on SIGTERM.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dispatcher_sidecar::kafka;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Kills the dispatcher if the test fails before it stops.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sets_up_topics_and_stops_on_sigterm() {
    let broker = common::Broker::start(45050);
    let config = broker.config("[[queue]]\nname = \"e2e\"\ntopic = \"e2e\"\n");
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let r = admin
        .create_topics(
            &[NewTopic::new("e2e", 2, TopicReplication::Fixed(1))],
            &AdminOptions::new().request_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    assert!(r[0].is_ok(), "{r:?}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dispatcher.toml");
    std::fs::write(
        &path,
        format!(
            "bootstrap_servers = \"{}\"\nhttp_listen = \"127.0.0.2:45051\"\ngrpc_listen = \"127.0.0.2:45052\"\n\
             receipt_secret = \"0123456789abcdef\"\n[[queue]]\nname = \"e2e\"\ntopic = \"e2e\"\n",
            broker.addr
        ),
    )
    .unwrap();
    let mut running = Running(
        Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let child = &mut running.0;

    let deadline = Instant::now() + TIMEOUT;
    loop {
        let md = admin.inner().fetch_metadata(None, TIMEOUT).unwrap();
        let names: Vec<&str> = md.topics().iter().map(|t| t.name()).collect();
        if ["e2e.dlq", "e2e.acklog", "e2e.retry.10s", "e2e.retry.1h"]
            .iter()
            .all(|t| names.contains(t))
        {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("dispatcher exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "topics not created within {TIMEOUT:?}: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "still running after setup"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            panic!("dispatcher did not stop within {TIMEOUT:?} of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}
