//! Finding the ONNX Runtime library, and what happens when it is missing or
//! broken. The failure cases run this test binary again as a child process
//! with a different environment, since a process loads ORT only once.

use std::path::Path;
use std::process::Command;

use baton_onnx::OnnxBackend;

const CHILD: &str = "BATON_ONNX_TEST_CHILD";
const FIX: &str = "run scripts/fetch-onnxruntime.sh or set ORT_DYLIB_PATH";

/// Runs the test `name` of `exe` in a child process with `ORT_DYLIB_PATH`
/// set to `dylib` (or unset) and the child marker set.
fn run_child(exe: &Path, name: &str, cwd: &Path, dylib: Option<&Path>) {
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"]).current_dir(cwd).env(CHILD, "1");
    match dylib {
        Some(path) => cmd.env("ORT_DYLIB_PATH", path),
        None => cmd.env_remove("ORT_DYLIB_PATH"),
    };
    let out = cmd.output().expect("run the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(text.contains("1 passed"), "child {name} did not run:\n{text}");
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// In the child: every entry point reports `kind`, saying how to fix it, and
/// keeps doing so.
fn expect_failure(kind: &str) {
    for _ in 0..2 {
        let e = baton_onnx::init().unwrap_err();
        eprintln!("init: [{}] {}", e.kind, e.message);
        assert_eq!(e.kind, kind, "{}", e.message);
        assert!(e.message.contains(FIX), "{}", e.message);
        let e = OnnxBackend::new().unwrap_err();
        assert_eq!(e.kind, kind, "{}", e.message);
    }
}

#[test]
fn the_fetched_library_is_found_and_loads() {
    if is_child() {
        return;
    }
    let path = baton_onnx::runtime_path()
        .unwrap_or_else(|e| panic!("ONNX Runtime is required for these tests [{}]: {}", e.kind, e.message));
    assert!(path.is_absolute() && path.is_file(), "{}", path.display());
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        assert!(path.ends_with(baton_onnx::RUNTIME_RELATIVE_PATH), "{}", path.display());
    }
    baton_onnx::init().unwrap();
    baton_onnx::init().unwrap();
    OnnxBackend::new().unwrap();
}

#[test]
fn child_missing_via_env() {
    if is_child() {
        let e = baton_onnx::runtime_path().unwrap_err();
        assert_eq!(e.kind, "runtime_missing");
        assert!(e.message.contains("/nonexistent/libonnxruntime.so") && e.message.contains(FIX), "{}", e.message);
        expect_failure("runtime_missing");
    }
}

#[test]
fn child_missing_everywhere() {
    if is_child() {
        let e = baton_onnx::runtime_path().unwrap_err();
        assert!(e.message.contains(".baton/lib/libonnxruntime.so"), "{}", e.message);
        expect_failure("runtime_missing");
    }
}

#[test]
fn child_not_a_library() {
    if is_child() {
        expect_failure("runtime_unusable");
    }
}

#[test]
fn a_missing_or_broken_runtime_is_an_error_that_says_how_to_fix_it() {
    if is_child() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // ORT_DYLIB_PATH naming a file that does not exist.
    run_child(&exe, "child_missing_via_env", tmp.path(), Some(Path::new("/nonexistent/libonnxruntime.so")));

    // A file that is not a shared library.
    let junk = tmp.path().join("libonnxruntime.so");
    std::fs::write(&junk, b"not a library").unwrap();
    run_child(&exe, "child_not_a_library", tmp.path(), Some(&junk));

    // No ORT_DYLIB_PATH and no .baton/lib above the current directory or the
    // executable: a copy of this test binary in an empty directory.
    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("runtime-test");
    std::fs::copy(&exe, &copy).unwrap();
    run_child(&copy, "child_missing_everywhere", alone.path(), None);
}
