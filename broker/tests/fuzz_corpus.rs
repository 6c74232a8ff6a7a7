//! Replays the committed fuzz corpus (`fuzz/corpus/<target>`), the crashes
//! found so far (`fuzz/regressions/<target>`) and the built-in seeds
//! through the broker's fuzz targets, plus a few blind mutations of each,
//! so the targets build and their properties hold on every `cargo test`
//! without an instrumented build of RocksDB. The libFuzzer runs are
//! `protocol/fuzz/run.sh`.

use std::path::Path;

use broker::fuzzing::{seeds, TARGETS};
use protocol::fuzzing::{replay_corpus, replay_inputs};

/// Blind mutations per corpus input. The log target opens a directory per
/// input, so it gets fewer.
fn mutations(name: &str) -> usize {
    if name == "log_recovery" {
        2
    } else {
        8
    }
}

#[test]
fn every_target_holds_on_its_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let seeds = seeds();
    for (i, (name, target)) in TARGETS.iter().enumerate() {
        let built: Vec<(String, Vec<u8>)> = seeds
            .iter()
            .filter(|(t, _)| t == name)
            .enumerate()
            .map(|(j, (_, data))| (format!("built-in seed {j}"), data.clone()))
            .collect();
        assert!(!built.is_empty(), "no built-in seed for {name}");
        let seed = i as u64 + 1;
        let n = replay_inputs(name, &built, *target, mutations(name), seed)
            + replay_corpus(
                name,
                &root.join("corpus").join(name),
                *target,
                mutations(name),
                seed,
            )
            + replay_corpus(name, &root.join("regressions").join(name), *target, 0, 0);
        eprintln!("{name}: {n} inputs");
    }
}
