//! `scripts/image.sh` and the root filesystem it makes, checked without
//! building an image: podman on the `PATH` is a stub that fails, so each
//! run stops at `podman build`, after the root filesystem (built by the real
//! mmdebstrap from Debian's archive, into a cache directory of the test's
//! own) and the checks on the binary. What the image does when it runs is
//! in `container.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A directory of stub commands, put first on the `PATH`: each writes its
/// arguments to `<dir>/<name>.called` and exits with status `code`.
struct Stubs {
    dir: tempfile::TempDir,
}

impl Stubs {
    fn new(stubs: &[(&str, i32)]) -> Stubs {
        let dir = tempfile::tempdir().expect("a temp dir");
        for (name, code) in stubs {
            let path = dir.path().join(name);
            let called = dir.path().join(format!("{name}.called"));
            std::fs::write(
                &path,
                format!("#!/bin/sh\necho \"$@\" >>'{}'\necho 'stub {name}' >&2\nexit {code}\n", called.display()),
            )
            .expect("writing a stub");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod a stub");
        }
        Stubs { dir }
    }

    fn path(&self) -> String {
        format!("{}:{}", self.dir.path().display(), std::env::var("PATH").unwrap_or_default())
    }

    /// The arguments `name` was called with, one call a line, if it was.
    fn called(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.called"))).ok()
    }
}

/// Runs `scripts/image.sh ARGS` with `stubs` first on the `PATH`, `cache`
/// as its root filesystem cache, and `env` set.
fn image_sh(args: &[&str], stubs: &Stubs, cache: &Path, env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new("bash");
    command
        .arg(root().join("scripts/image.sh"))
        .args(args)
        .env("PATH", stubs.path())
        .env("BATON_IMAGE_CACHE", cache)
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("running scripts/image.sh")
}

/// The one root filesystem in `cache`.
fn rootfs_in(cache: &Path) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(cache)
        .expect("reading the cache")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("rootfs-")))
        .filter(|p| p.extension().is_some_and(|e| e == "tar") && !p.to_string_lossy().ends_with(".partial.tar"))
        .collect();
    assert_eq!(found.len(), 1, "not one root filesystem in the cache: {found:?}");
    found.into_iter().next().expect("one")
}

/// `tar ARGS` and its stdout.
fn tar(args: &[&str]) -> String {
    let output = Command::new("tar").args(args).output().expect("running tar");
    assert!(output.status.success(), "tar {args:?}: {}", text(&output.stderr));
    text(&output.stdout)
}

#[test]
fn the_rootfs_hook_records_the_packages_in_dpkg_s_status_and_leaves_no_mirror_behind() {
    // A root as mmdebstrap hands it to the hook: a package downloaded into
    // apt's archives, a certificate, apt's configuration naming a mirror
    // with credentials.
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path().join("root");
    let package = dir.path().join("package");
    std::fs::create_dir_all(package.join("DEBIAN")).expect("mkdir");
    std::fs::write(
        package.join("DEBIAN/control"),
        "Package: baton-fake\nVersion: 1.2-3\nArchitecture: all\nMaintainer: baton <baton@example.com>\n\
         Description: a package for a test\n",
    )
    .expect("writing control");
    let archives = root.join("var/cache/apt/archives");
    std::fs::create_dir_all(&archives).expect("mkdir");
    let built = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&package)
        .arg(archives.join("baton-fake_1.2-3_all.deb"))
        .output()
        .expect("running dpkg-deb");
    assert!(built.status.success(), "dpkg-deb --build: {}", text(&built.stderr));
    // libssl3 as unpacked: the hook removes its one file, so it must not be
    // listed (scanners would report OpenSSL's advisories for it).
    let ssl = dir.path().join("libssl3");
    let library = "usr/lib/x86_64-linux-gnu/libssl.so.3";
    for at in [&ssl, &root] {
        std::fs::create_dir_all(at.join(library).parent().expect("a parent")).expect("mkdir");
        std::fs::write(at.join(library), "not a library").expect("writing the library");
    }
    std::fs::create_dir_all(ssl.join("DEBIAN")).expect("mkdir");
    std::fs::write(
        ssl.join("DEBIAN/control"),
        "Package: libssl3\nVersion: 3.0.15-1\nArchitecture: amd64\nMaintainer: baton <baton@example.com>\n\
         Description: a package whose files the hook removes\n",
    )
    .expect("writing control");
    let built = Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&ssl)
        .arg(archives.join("libssl3_3.0.15-1_amd64.deb"))
        .output()
        .expect("running dpkg-deb");
    assert!(built.status.success(), "dpkg-deb --build: {}", text(&built.stderr));
    std::fs::create_dir_all(root.join("usr/share/ca-certificates/test")).expect("mkdir");
    std::fs::write(root.join("usr/share/ca-certificates/test/a.crt"), "-----BEGIN CERTIFICATE-----\n")
        .expect("a certificate");
    std::fs::create_dir_all(root.join("etc/apt/apt.conf.d")).expect("mkdir");
    std::fs::write(root.join("etc/apt/sources.list"), "deb http://user:secret@mirror.example/debian bookworm main\n")
        .expect("sources.list");
    std::fs::write(root.join("etc/apt/apt.conf.d/00mmdebstrap"), "Apt::Install-Recommends \"0\";\n").expect("conf");

    let hook = root_hook();
    let output = Command::new("sh").arg(&hook).arg(&root).output().expect("running the hook");
    assert!(output.status.success(), "the hook failed: {}", text(&output.stderr));

    assert!(!root.join("etc/apt").exists(), "the hook left /etc/apt");
    let grep = Command::new("grep").args(["-r", "-l", "user:secret"]).arg(&root).output().expect("running grep");
    assert_eq!(grep.status.code(), Some(1), "the mirror's credentials are still in: {}", text(&grep.stdout));
    let status = std::fs::read_to_string(root.join("var/lib/dpkg/status")).expect("dpkg's status");
    assert!(
        status.contains("Package: baton-fake\nStatus: install ok installed\n") && status.contains("Version: 1.2-3\n"),
        "{status}"
    );
    assert!(!root.join(library).exists(), "the hook kept {library}");
    assert!(!status.contains("Package: libssl3\n"), "a package none of whose files is left is listed:\n{status}");
}

fn root_hook() -> PathBuf {
    root().join("deploy/container/rootfs-hook.sh")
}

#[test]
fn the_root_filesystem_lists_its_debian_packages_names_no_mirror_and_is_rebuilt_when_old() {
    let cache = tempfile::tempdir().expect("a cache dir");
    let stubs = Stubs::new(&[("podman", 4)]);
    let bin = env!("CARGO_BIN_EXE_baton");
    let output = image_sh(&["--binary", bin], &stubs, cache.path(), &[]);
    let stderr = text(&output.stderr);
    // It got as far as building the image (the stub).
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stubs.called("podman").is_some_and(|c| c.contains("build")), "{stderr}");

    let rootfs = rootfs_in(cache.path());
    let rootfs_path = rootfs.to_str().expect("a UTF-8 path");
    let listing = tar(&["-tf", rootfs_path]);
    let apt: Vec<&str> = listing.lines().filter(|l| l.starts_with("./etc/apt")).collect();
    assert!(apt.is_empty(), "apt's configuration, which names the mirror, is in the image: {apt:?}");
    assert!(listing.lines().any(|l| l == "./etc/os-release"), "no /etc/os-release");
    assert!(listing.lines().any(|l| l == "./etc/debian_version"), "no /etc/debian_version");
    let status = tar(&["-xOf", rootfs_path, "./var/lib/dpkg/status"]);
    let libssl = listing.lines().any(|l| l.starts_with("./usr/lib/") && l.ends_with("/libssl.so.3"));
    assert!(
        libssl || !status.contains("Package: libssl3\n"),
        "dpkg's status lists libssl3, whose library the image does not hold:\n{status}"
    );
    for package in ["libc6", "libstdc++6", "libgcc-s1", "ca-certificates", "base-files"] {
        assert!(
            status.contains(&format!("Package: {package}\nStatus: install ok installed\n")),
            "{package} is not in dpkg's status:\n{status}"
        );
    }

    // Eight days later, the cached root filesystem is built again.
    let old = SystemTime::now() - Duration::from_secs(8 * 86400);
    std::fs::File::options().write(true).open(&rootfs).expect("the rootfs").set_modified(old).expect("set mtime");
    let output = image_sh(&["--binary", bin], &stubs, cache.path(), &[]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("is 8 days"), "the age of the cache is not said: {stderr}");
    let modified = std::fs::metadata(rootfs_in(cache.path())).expect("the rootfs").modified().expect("mtime");
    assert!(modified > old + Duration::from_secs(86400), "the old root filesystem was kept: {stderr}");
}

#[test]
fn without_binary_the_script_builds_the_release_binary_every_time() {
    // A release binary is there already; the script must still ask cargo
    // to bring it up to date (the stub fails, so nothing else runs).
    let target = tempfile::tempdir().expect("a target dir");
    std::fs::create_dir_all(target.path().join("release")).expect("mkdir");
    std::fs::copy(env!("CARGO_BIN_EXE_baton"), target.path().join("release/baton")).expect("copying baton");
    let cache = tempfile::tempdir().expect("a cache dir");
    let stubs = Stubs::new(&[("cargo", 3), ("podman", 4)]);
    let output = image_sh(&[], &stubs, cache.path(), &[("CARGO_TARGET_DIR", target.path())]);
    let stderr = text(&output.stderr);
    let called = stubs.called("cargo").unwrap_or_else(|| panic!("cargo was not run: {stderr}"));
    assert!(called.contains("build --release --locked -p baton-server"), "{called}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cargo build --release --locked -p baton-server failed"), "{stderr}");
    assert!(stubs.called("podman").is_none(), "it went on after cargo failed: {stderr}");
}

#[test]
fn a_binary_that_needs_a_newer_glibc_than_the_suite_s_is_refused_naming_what_it_lacks() {
    // The binary under test was built on this machine: bullseye's glibc
    // (2.31) is older than what it asks for.
    let bin = env!("CARGO_BIN_EXE_baton");
    let needs = Command::new("objdump").args(["-p", bin]).output().expect("running objdump");
    let needs = text(&needs.stdout);
    assert!(
        ["GLIBC_2.32", "GLIBC_2.33", "GLIBC_2.34"].iter().any(|v| needs.contains(v)),
        "the binary under test needs no glibc newer than bullseye's; this test needs one that does"
    );
    let cache = tempfile::tempdir().expect("a cache dir");
    let stubs = Stubs::new(&[("podman", 4)]);
    let output = image_sh(&["--binary", bin, "--suite", "bullseye"], &stubs, cache.path(), &[]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs GLIBC_2.3") && stderr.contains("of libc.so.6"), "{stderr}");
    assert!(stderr.contains("bullseye") && stderr.contains("libc6 2.31"), "{stderr}");
    assert!(stubs.called("podman").is_none_or(|c| !c.contains("build")), "it built the image: {stderr}");
}
