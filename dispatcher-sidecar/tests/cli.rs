//! The binary's command line: a bad configuration exits 2 with one line
//! naming the file, queue and key.

use std::process::Command;

fn dispatcher(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_invalid_key_exits_2_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dispatcher.toml");
    std::fs::write(
        &path,
        "[[queue]]\nname = \"jobs\"\ntopic = \"jobs\"\nlease = \"6x\"\n",
    )
    .unwrap();
    let (code, stderr) = dispatcher(&["--config", path.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        format!(
            "{}: queue \"jobs\": key \"lease\": invalid duration \"6x\" \
             (write <integer><unit>, unit ms, s, m, h or d)\n",
            path.display()
        )
    );
}

#[test]
fn a_missing_file_or_flag_exits_2() {
    let (code, stderr) = dispatcher(&["--config", "/nonexistent/d.toml"]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with("/nonexistent/d.toml: cannot read: "),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1);
    let (code, stderr) = dispatcher(&[]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with("dispatcher: --config <file> is required"),
        "{stderr}"
    );
}
