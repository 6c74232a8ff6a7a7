//! Derives fuzz seeds from captured request frames:
//! `fuzz_seeds <capture dir> <corpus root>` writes each seed to
//! `<corpus root>/<target>/<hash>`. See `fuzz/README.md`.

use std::path::PathBuf;

use bytes::Bytes;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, capture, root] = args.as_slice() else {
        eprintln!("usage: fuzz_seeds <capture dir> <corpus root>");
        std::process::exit(2);
    };
    let mut frames = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(capture)
        .expect("capture directory")
        .map(|e| e.expect("entry").path())
        .collect();
    paths.sort();
    for path in paths {
        frames.push(Bytes::from(std::fs::read(&path).expect("frame")));
    }
    let seeds = protocol::fuzzing::seeds_from_frames(&frames);
    let written = write_seeds(&PathBuf::from(root), &seeds);
    eprintln!("{} frames, {written} seeds", frames.len());
}

/// Writes each seed under its target's directory, named by its content's
/// hash (so a seed seen twice is written once). Returns how many are new.
fn write_seeds(root: &std::path::Path, seeds: &[(&str, Vec<u8>)]) -> usize {
    let mut written = 0;
    for (target, data) in seeds {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).expect("corpus directory");
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in data {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let path = dir.join(format!("{hash:016x}"));
        if !path.exists() {
            std::fs::write(path, data).expect("seed");
            written += 1;
        }
    }
    written
}
