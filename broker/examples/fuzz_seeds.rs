//! Derives fuzz seeds for the broker's targets from a broker's `log.dirs`
//! after a real run, plus the built-in ones:
//! `fuzz_seeds <log.dirs> <corpus root>` writes each seed to
//! `<corpus root>/<target>/<hash>`. See `protocol/fuzz/README.md`.

use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, data_dir, root] = args.as_slice() else {
        eprintln!("usage: fuzz_seeds <log.dirs> <corpus root>");
        std::process::exit(2);
    };
    let mut seeds = broker::fuzzing::seeds();
    seeds.extend(broker::fuzzing::seeds_from_data_dir(Path::new(data_dir)));
    let mut written = 0;
    for (target, data) in &seeds {
        let dir = Path::new(root).join(target);
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
    eprintln!("{} seeds, {written} new", seeds.len());
}
