//! Replays the committed fuzz corpus (`fuzz/corpus/<target>`), the crashes
//! found so far (`fuzz/regressions/<target>`) and the built-in seeds
//! through the dispatcher's fuzz targets, plus a few blind mutations of
//! each, so the targets build and their properties hold on every
//! `cargo test` without an instrumented build of librdkafka. The libFuzzer
//! runs are `protocol/fuzz/run.sh`.

use std::path::Path;

use dispatcher_sidecar::fuzzing::{seeds, TARGETS};
use protocol::fuzzing::{replay_corpus, replay_inputs};

const MUTATIONS: usize = 64;

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
        let n = replay_inputs(name, &built, *target, MUTATIONS, seed)
            + replay_corpus(
                name,
                &root.join("corpus").join(name),
                *target,
                MUTATIONS,
                seed,
            )
            + replay_corpus(name, &root.join("regressions").join(name), *target, 0, 0);
        eprintln!("{name}: {n} inputs");
    }
}
