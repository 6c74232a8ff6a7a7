//! `broker [server.properties] [--override key=value]... [--add-scram <spec>]...`
//!
//! With no arguments: a single node on 127.0.0.1:9092 with its data under
//! `./data`. An invalid config prints one line naming the key and exits 2.

use broker::config::ServerConfig;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: broker [server.properties] [--override key=value]... [--add-scram <mechanism>=[name=<user>,password=<password>]]...");
        println!("  --add-scram: a SCRAM user the cluster is formed with (first start only), as kafka-storage format --add-scram");
        return;
    }
    let config = match ServerConfig::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("broker: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        if let Some(addr) = config.metrics_listen {
            if let Err(e) = metrics_exporter_prometheus::PrometheusBuilder::new()
                .with_http_listener(addr)
                .install()
            {
                eprintln!("broker: cannot serve metrics on {addr}: {e}");
                std::process::exit(2);
            }
        }
        let running = match broker::start(config).await {
            Ok(r) => r,
            Err(e) => {
                eprintln!("broker: {e}");
                std::process::exit(1);
            }
        };
        tracing::info!(addr = %running.local_addr, "broker ready");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        let mut fatal = running.fatal();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            reason = fatal.wait_for(Option::is_some) => {
                let reason = reason.map(|r| r.clone().unwrap_or_default()).unwrap_or_default();
                // Kafka halts here too: nothing is closed cleanly, the next
                // start recovers the logs.
                tracing::error!(%reason, "fatal: the log directory failed; exiting");
                eprintln!("broker: fatal: the log directory failed: {reason}");
                std::process::exit(1);
            }
        }
        tracing::info!("shutting down");
        running.shutdown().await;
    });
}
