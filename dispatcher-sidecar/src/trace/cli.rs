//! `dispatcher trace <message_id> [--url U] [--queue Q] [--json]`: asks a
//! dispatcher's HTTP API where a message is and prints its path.

use std::time::Duration;

use anyhow::Context as _;

use super::{EventKind, MessageTrace, TraceEvent, TraceResponse};
use crate::api::json::rfc3339_ms;

pub const USAGE: &str =
    "usage: dispatcher trace <message_id> [--url http://127.0.0.1:8080] [--queue <name>] [--json]";
const DEFAULT_URL: &str = "http://127.0.0.1:8080";
const TIMEOUT: Duration = Duration::from_secs(60);

/// The subcommand's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceArgs {
    pub message_id: String,
    pub url: String,
    pub queue: Option<String>,
    pub json: bool,
}

/// Parses the arguments after `trace`; `None` for `--help`.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<TraceArgs>, String> {
    let mut args = args.peekable();
    let (mut id, mut url, mut queue, mut json) = (None, None, None, false);
    while let Some(arg) = args.next() {
        let mut value = |flag: &str, inline: Option<&str>| -> Result<String, String> {
            match inline {
                Some(v) => Ok(v.to_owned()),
                None => args.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v)),
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--json" => json = true,
            "--url" => url = Some(value("--url", inline)?),
            "--queue" => queue = Some(value("--queue", inline)?),
            other if other.starts_with("--") => {
                return Err(format!("unexpected argument {other:?}"))
            }
            _ => {
                if id.replace(arg).is_some() {
                    return Err("one message id at a time".into());
                }
            }
        }
    }
    let message_id = id.ok_or("the message id is required")?;
    Ok(Some(TraceArgs {
        message_id,
        url: url.unwrap_or_else(|| DEFAULT_URL.to_owned()),
        queue,
        json,
    }))
}

/// What the command prints, or why it failed (exit 1). A message no queue
/// knows is a failure too, with the dispatcher's message.
pub async fn run(args: &TraceArgs) -> anyhow::Result<String> {
    let base = if args.url.contains("://") {
        args.url.clone()
    } else {
        format!("http://{}", args.url)
    };
    let mut url = reqwest::Url::parse(&base).with_context(|| format!("--url {:?}", args.url))?;
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("--url {:?} takes no path", args.url))?
        .pop_if_empty()
        .push("messages")
        .push(&args.message_id);
    if let Some(q) = &args.queue {
        url.query_pairs_mut().append_pair("queue", q);
    }
    crate::security::tls::install_ring_provider();
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .no_proxy()
        .build()
        .context("creating the HTTP client")?;
    let mut request = client.get(url.clone());
    // A dispatcher with [auth] wants a bearer token (docs/dispatcher/security.md).
    if let Ok(token) = std::env::var("DISPATCHER_TOKEN") {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response.text().await.context("reading the answer")?;
    if !status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or(body);
        anyhow::bail!("HTTP {status}: {message}");
    }
    if args.json {
        return Ok(body);
    }
    let answer: TraceResponse = serde_json::from_str(&body).context("the answer is not a trace")?;
    Ok(render(&answer))
}

/// The trace for a person: one line per event, then the state.
pub fn render(answer: &TraceResponse) -> String {
    let mut out = String::new();
    for t in &answer.traces {
        render_one(&mut out, t);
    }
    out
}

fn render_one(out: &mut String, t: &MessageTrace) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "message {} in queue {}", t.message_id, t.queue);
    for e in &t.events {
        let _ = writeln!(out, "  {}  {}", rfc3339_ms(e.at), describe(e));
    }
    let status = serde_json::to_value(t.state.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let _ = writeln!(out, "  now: {status}: {}", t.state.detail);
}

fn describe(e: &TraceEvent) -> String {
    let place = || match (&e.topic, e.partition, e.offset) {
        (Some(t), Some(p), Some(o)) => format!("{t} partition {p} offset {o}"),
        _ => "?".to_owned(),
    };
    match e.event {
        EventKind::Produced => format!("produced to {}", place()),
        EventKind::DeliveryFailed => format!(
            "delivery failed: attempt {}, consumer {}, error: {}",
            e.attempt.map_or("?".into(), |a| a.to_string()),
            e.consumer.as_deref().unwrap_or("(anonymous)"),
            e.error.as_deref().unwrap_or("")
        ),
        EventKind::Retried => format!("copied to retry tier {}", place()),
        EventKind::DeadLettered => format!("dead-lettered to {}", place()),
        EventKind::Redriven => format!("redriven to {}", place()),
        EventKind::Held => format!("held (parked key) in {}", place()),
        EventKind::Moved => format!("moved to {}", place()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<TraceArgs>, String> {
        parse_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments_take_both_forms_and_need_one_id() {
        let t = args(&["m-1", "--url", "http://h:1", "--queue=jobs", "--json"])
            .unwrap()
            .unwrap();
        assert_eq!(t.message_id, "m-1");
        assert_eq!(t.url, "http://h:1");
        assert_eq!(t.queue.as_deref(), Some("jobs"));
        assert!(t.json);
        assert_eq!(args(&["m"]).unwrap().unwrap().url, DEFAULT_URL);
        assert_eq!(args(&["--help"]), Ok(None));
        assert!(args(&[]).is_err());
        assert!(args(&["a", "b"]).is_err());
        assert!(args(&["a", "--url"]).is_err());
        assert!(args(&["a", "--nope"]).is_err());
    }
}
