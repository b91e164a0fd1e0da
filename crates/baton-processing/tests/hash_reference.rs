//! The hash of categorical features against the reference users have:
//! Python's `mmh3` package (`mmh3.hash(value, seed, signed=False)`), run in
//! the project's client venv (.baton/venv, made by scripts/setup-clients.sh).

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use baton_processing::features::FeatureSpec;
use baton_processing::features::hash::murmur3_x86_32;
use common::{ids, texts};

/// Seeds users meet: scikit-learn's 0, Spark's 42, and the extremes.
const SEEDS: [u32; 4] = [0, 42, 1, 0xffff_ffff];

/// Values that cover every tail length of the 4-byte blocks, text beyond
/// ASCII, and arbitrary bytes.
fn values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = (0..=33).map(|n| b"abcdefghijklmnopqrstuvwxyz0123456789"[..n].to_vec()).collect();
    for text in ["ad-1", "news.example", "Zürich", "東京", "🙂 emoji", "unknown", " "] {
        values.push(text.as_bytes().to_vec());
    }
    let mut state = 0x2545_f491_u32;
    for len in [1, 5, 64, 257] {
        values.push(
            (0..len)
                .map(|_| {
                    state = state.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (state >> 16) as u8
                })
                .collect(),
        );
    }
    values
}

/// `mmh3.hash(value, seed, signed=False)` for every value (hex, one a line)
/// and seed, in that order, from Python.
fn python_hashes(values: &[Vec<u8>]) -> Vec<u32> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.baton/venv/bin/python");
    assert!(python.is_file(), "{} is missing: run scripts/setup-clients.sh", python.display());
    let script = format!(
        "import sys, mmh3\nfor line in sys.stdin.read().split():\n    v = bytes.fromhex(line[1:])\n    \
         print(' '.join(str(mmh3.hash(v, s, signed=False)) for s in {SEEDS:?}))\n"
    );
    let mut child = Command::new(&python)
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    // A prefix keeps the empty value a non-empty line.
    let input: String =
        values.iter().map(|v| format!("x{}\n", v.iter().map(|b| format!("{b:02x}")).collect::<String>())).collect();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn murmur3_matches_python_mmh3_for_every_tail_and_seed() {
    let values = values();
    let want = python_hashes(&values);
    assert_eq!(want.len(), values.len() * SEEDS.len());
    let got: Vec<u32> = values.iter().flat_map(|v| SEEDS.map(|seed| murmur3_x86_32(v, seed))).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let (value, seed) = (&values[i / SEEDS.len()], SEEDS[i % SEEDS.len()]);
        assert_eq!(g, w, "value {:?} seed {seed}", String::from_utf8_lossy(value));
    }
}

#[test]
fn hashed_features_are_python_buckets() {
    let spec = FeatureSpec::parse(
        "[[feature]]\nname = \"c\"\ndatatype = \"BYTES\"\ngraph_input = \"ids\"\n\
         hash_strings = { hash = \"murmur3_x86_32\", seed = 42, buckets = 1000003 }\n",
    )
    .unwrap();
    let values = values();
    let text: Vec<String> = values.iter().map(|v| String::from_utf8_lossy(v).into_owned()).collect();
    let refs: Vec<&str> = text.iter().map(String::as_str).collect();
    let out = spec.apply(&[texts("c", &refs)]).unwrap();
    let lossy: Vec<Vec<u8>> = text.iter().map(|t| t.as_bytes().to_vec()).collect();
    let want: Vec<i64> =
        python_hashes(&lossy).chunks(SEEDS.len()).map(|per_seed| i64::from(per_seed[1] % 1_000_003)).collect();
    assert_eq!(ids(&out[0]), want);
}
