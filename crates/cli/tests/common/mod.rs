//! Helpers shared by the `specfit` binary's end-to-end tests: running the binary from the
//! repository root, temporary files, one-line error checks, and fixture checkpoints with a
//! tokenizer.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `generate` greedily for 20 tokens after a fixed prompt through 2 slots per layer: the plain
/// run the speculative ones are compared with (append `--model`, `--drafter`, … as needed).
pub const GREEDY_20: [&str; 8] = [
    "generate",
    "--prompt-ids",
    "1,243,56,119",
    "--max-tokens",
    "20",
    "--ignore-eos",
    "--slots",
    "2",
];

/// A command line written as one string, split at white space, each `{}` word replaced by the
/// next of `values` (paths and other values that may hold spaces go there, never into `text`).
pub fn cli<'a>(text: &'a str, values: &[&'a str]) -> Vec<&'a str> {
    let mut values = values.iter().copied();
    let words = text
        .split_whitespace()
        .map(|w| match w {
            "{}" => values.next().expect("fewer values than {} in the line"),
            _ => w,
        })
        .collect();
    assert!(values.next().is_none(), "more values than {{}} in {text:?}");
    words
}

/// Owned command-line words as the `&str`s the helpers take.
pub fn words(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `--policy specfit --drafter DRAFTER --calibration CAL`: SpecFit with `drafter` believing
/// calibration `cal` (append to a `generate` line).
pub fn specfit_flags<'a>(drafter: &'a str, cal: &'a Path) -> Vec<&'a str> {
    cli(
        "--policy specfit --drafter {} --calibration {}",
        &[drafter, cal.to_str().unwrap()],
    )
}

/// `specfit calibrate --probes PROBES [--model MODEL] --out OUT`: fits a calibration from probe
/// rows (stamped with MODEL's shape when given).
pub fn fit_probes(probes: &Path, model: Option<&str>, out: &Path) {
    let mut args = vec!["calibrate", "--probes", probes.to_str().unwrap()];
    if let Some(m) = model {
        args.extend(["--model", m]);
    }
    args.extend(["--out", out.to_str().unwrap()]);
    ok(&args);
}

/// Panics unless two runs printed the same tokens (their standard output, trimmed).
pub fn same_output(got: &Output, want: &Output, what: &str) {
    assert_eq!(
        String::from_utf8_lossy(&got.stdout).trim(),
        String::from_utf8_lossy(&want.stdout).trim(),
        "{what}"
    );
}

/// A fixture target of another shape than the shipped one (`fixtures/qwen3moe/topk_norm`).
pub fn other_target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen3moe/topk_norm")
}

pub fn specfit(args: &[&str], stdin: Option<&str>) -> Output {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_specfit"));
    cmd.args(args)
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn specfit");
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

/// Runs `specfit args` and asserts it succeeded (showing its stderr if not).
pub fn ok(args: &[&str]) -> Output {
    let out = specfit(args, None);
    assert!(
        out.status.success(),
        "specfit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `name` in this test binary's scratch folder under cargo's `target/tmp`, which is emptied the
/// first time this process asks for it (so runs neither see nor pile up each other's files).
pub fn temp(name: &str) -> PathBuf {
    static EMPTIED: std::sync::Once = std::sync::Once::new();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("specfit-cli-{}", env!("CARGO_CRATE_NAME")));
    EMPTIED.call_once(|| {
        let _ = std::fs::remove_dir_all(&dir);
    });
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `args` exits 2 and its last stderr line (after any progress lines) says `want`.
pub fn ends_in_error(args: &[&str], want: &str) {
    let out = specfit(args, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains(want),
        "{args:?}: {stderr}"
    );
}

pub fn fails_with(args: &[&str], stdin: Option<&str>, want: &str) {
    let out = specfit(args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: one line, got {stderr:?}"
    );
    assert!(
        stderr.contains(want),
        "{args:?}: got {stderr:?}, want {want:?}"
    );
    assert!(!stderr.contains("panicked"));
}

/// A copy of a fixture checkpoint with a word-level tokenizer over its 256 ids: 0–2 are the
/// ChatML specials, id `i` ≥ 3 is the word `w{i}`.
pub fn fixture_with_tokenizer(name: &str) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/qwen3moe")
        .join(name);
    let dir = temp(&format!("model-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut vocab = serde_json::Map::new();
    for (i, s) in specials.iter().enumerate() {
        vocab.insert(s.to_string(), serde_json::json!(i));
    }
    for i in 3..256 {
        vocab.insert(format!("w{i}"), serde_json::json!(i));
    }
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| serde_json::json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|endoftext|>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let cfg = serde_json::json!({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}
