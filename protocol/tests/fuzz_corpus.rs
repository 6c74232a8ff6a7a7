//! Replays the built-in seeds, the committed fuzz corpus
//! (`fuzz/corpus/<target>`) and the crashes found so far
//! (`fuzz/regressions/<target>`) through the fuzz targets, plus a few blind
//! mutations of each, so the targets build and their properties hold on
//! every `cargo test`. The libFuzzer runs are `fuzz/run.sh`.

use std::path::Path;

use protocol::fuzzing::{replay_corpus, replay_inputs, seeds, TARGETS};

/// Blind mutations per corpus input; the built-in seeds get more.
const MUTATIONS: usize = 8;

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
        let n = replay_inputs(name, &built, *target, MUTATIONS * 16, seed)
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
