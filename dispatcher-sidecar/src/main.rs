//! `dispatcher --config <file>`: reads the configuration, then runs the
//! dispatcher (`dispatcher_sidecar::run`). A bad command line or
//! configuration exits 2 with one line naming the problem.
//!
//! `dispatcher trace <message_id> [--url U] [--queue Q] [--json]` asks a
//! running dispatcher where a message is (`dispatcher_sidecar::trace::cli`).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: dispatcher --config <file.toml>\n       dispatcher trace <message_id> [--url http://127.0.0.1:8080] [--queue <name>] [--json]";

/// mimalloc rather than glibc's malloc: the per-message allocations of a
/// busy dispatcher (fetched records, deliveries, JSON) spent a fifth of its
/// CPU time in glibc's allocator (docs/benchmarks.md). Built with its
/// `override` feature, it is also the malloc of librdkafka's C code.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (Linux). mimalloc asks
/// for them on its arenas (`MADV_HUGEPAGE`) and returns freed memory to the
/// OS in smaller pieces, so the next touch of a purged piece faults in and
/// zeroes a whole new 2 MiB page. Under load that zeroing, mostly of
/// librdkafka's fetch buffers, took from 2% to 28% of the dispatcher's CPU
/// from one benchmark run to the next; with THP off its rate went up by a
/// quarter and its CPU per message down by a fifth (docs/benchmarks.md).
/// The flag is checked at every page fault, so memory mimalloc mapped
/// before `main` is covered too. Same as `MIMALLOC_ALLOW_THP=0`, which only
/// works from the environment.
fn disable_transparent_huge_pages() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::thread::disable_transparent_huge_pages(true)?;
    Ok(())
}

fn main() -> ExitCode {
    let thp_off = disable_transparent_huge_pages();
    dispatcher_sidecar::security::tls::install_ring_provider();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = thp_off {
        // docs/operations.md says THP is off; say so when it is not.
        tracing::warn!("transparent huge pages stay on for this process: {e}");
    }
    if std::env::args().nth(1).as_deref() == Some("trace") {
        return trace(std::env::args().skip(2));
    }
    let path = match config_path(std::env::args().skip(1)) {
        Ok(Some(path)) => path,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("dispatcher: {why}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let config = match dispatcher_sidecar::config::Config::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dispatcher: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatcher_sidecar::run(config));
    // A blocking call still waiting for Kafka (a commit to a coordinator that
    // is gone) must not hold the exit up.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("dispatcher stopped: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `dispatcher trace ...`: prints the path of a message, exits 1 when the
/// dispatcher does not know it or cannot be asked, 2 on a bad command line.
fn trace(args: impl Iterator<Item = String>) -> ExitCode {
    use dispatcher_sidecar::trace::cli;
    let args = match cli::parse_args(args) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(why) => {
            eprintln!("dispatcher trace: {why}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dispatcher trace: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(&args)) {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dispatcher trace: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The config file from `--config <file>` or `--config=<file>`; `None` for
/// `--help`.
fn config_path(args: impl Iterator<Item = String>) -> Result<Option<PathBuf>, String> {
    let mut args = args.peekable();
    let mut path = None;
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--config" => args
                .next()
                .ok_or_else(|| "--config needs a file".to_string())?,
            other => match other.strip_prefix("--config=") {
                Some(v) => v.to_string(),
                None => return Err(format!("unexpected argument {other:?}")),
            },
        };
        if path.replace(PathBuf::from(value)).is_some() {
            return Err("--config given twice".to_string());
        }
    }
    path.map(Some)
        .ok_or_else(|| "--config <file> is required".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<PathBuf>, String> {
        config_path(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_config_flag_is_required_and_taken_in_both_forms() {
        assert_eq!(args(&["--config", "d.toml"]), Ok(Some("d.toml".into())));
        assert_eq!(args(&["--config=d.toml"]), Ok(Some("d.toml".into())));
        assert_eq!(args(&["--help"]), Ok(None));
        assert_eq!(args(&[]), Err("--config <file> is required".into()));
        assert_eq!(args(&["--config"]), Err("--config needs a file".into()));
        assert_eq!(args(&["x"]), Err("unexpected argument \"x\"".into()));
        assert_eq!(
            args(&["--config", "a", "--config", "b"]),
            Err("--config given twice".into())
        );
    }
}
