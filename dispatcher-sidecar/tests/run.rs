//! The binary end to end: `dispatcher --config` against our broker sets up
//! the queue's topics, joins the group, runs without transparent huge
//! pages, and leaves cleanly on SIGTERM.

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

/// Creates the queue's topic `name` (2 partitions), then starts the binary
/// for a queue of that name with its APIs on 127.0.0.2:`api_port` and
/// `api_port` + 1, and waits until it has created the queue's topics.
async fn start_dispatcher(broker: &common::Broker, name: &str, api_port: u16) -> Running {
    let config = broker.config(&format!(
        "[[queue]]\nname = \"{name}\"\ntopic = \"{name}\"\n"
    ));
    let admin: AdminClient<DefaultClientContext> = kafka::admin_config(&config).create().unwrap();
    let r = admin
        .create_topics(
            &[NewTopic::new(name, 2, TopicReplication::Fixed(1))],
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
            "bootstrap_servers = \"{}\"\nhttp_listen = \"127.0.0.2:{api_port}\"\n\
             grpc_listen = \"127.0.0.2:{}\"\ninternal_listen = \"127.0.0.3:{api_port}\"\n\
             receipt_secret = \"0123456789abcdef\"\n\
             [[queue]]\nname = \"{name}\"\ntopic = \"{name}\"\n",
            broker.addr,
            api_port + 1
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

    let derived = [".dlq", ".acklog", ".retry.10s", ".retry.1h"].map(|t| format!("{name}{t}"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let md = admin.inner().fetch_metadata(None, TIMEOUT).unwrap();
        let names: Vec<&str> = md.topics().iter().map(|t| t.name()).collect();
        if derived.iter().all(|t| names.contains(&t.as_str())) {
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
    running
}

/// Sends SIGTERM and waits up to `limit` for the process to exit.
async fn terminate(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            panic!("dispatcher did not stop within {limit:?} of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sets_up_topics_and_stops_on_sigterm() {
    let broker = common::Broker::start(45050);
    let mut running = start_dispatcher(&broker, "e2e", 45051).await;
    // Transparent huge pages are off for the process (src/main.rs): the
    // kernel reports it per process (Linux 5.0 and later).
    if cfg!(target_os = "linux") {
        let status = std::fs::read_to_string(format!("/proc/{}/status", running.0.id())).unwrap();
        let thp = status.lines().find(|l| l.starts_with("THP_enabled:"));
        assert_eq!(
            thp.map(|l| l.split_whitespace().collect::<Vec<_>>()),
            Some(vec!["THP_enabled:", "0"]),
            "{status}"
        );
    }
    let status = terminate(&mut running.0, TIMEOUT).await;
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}

/// With its broker gone, a dispatcher told to stop cannot commit its final
/// offsets; it must still stop within its stop grace (30 s) rather than wait
/// for a coordinator that does not come back. (Before the grace and the
/// bounded runtime shutdown it took 30 s here, waiting on librdkafka; now
/// about 2 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_stops_on_sigterm_when_its_broker_is_gone() {
    let broker = common::Broker::start(45070);
    let mut running = start_dispatcher(&broker, "orphan", 45071).await;
    drop(broker);
    let started = Instant::now();
    let limit = dispatcher_sidecar::STOP_GRACE + Duration::from_secs(10);
    let status = terminate(&mut running.0, limit).await;
    eprintln!("stopped in {:?} with {status}", started.elapsed());
}
