//! Helpers of the tests that upgrade the server: asking for an upgrade
//! (and hanging up on it), following the processes it starts and ends, and
//! the binary an upgrade runs: the server's own executable path, which the
//! tests point at a copy of the binary under test in a directory of their
//! own, and replace there (an atomic rename) with a second, different
//! binary or a script standing for one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, Server};

/// A process the test did not start but must stop: SIGTERM, then waits
/// until it is gone.
pub struct Adopted(pub u32);

impl Drop for Adopted {
    fn drop(&mut self) {
        let kill = |signal: &str| {
            let pid = self.0.to_string();
            let _ =
                std::process::Command::new("kill").args([signal, &pid]).stderr(std::process::Stdio::null()).status();
        };
        if gone(self.0) {
            return;
        }
        kill("-TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !gone(self.0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !gone(self.0) {
            kill("-KILL");
        }
    }
}

/// `POST /baton/v1/upgrade` with `body` to the server at `base`.
pub fn upgrade(base: &str, body: &[u8]) -> baton_testkit::server::Answer {
    Client::new(base).post_raw("/baton/v1/upgrade", body, &[("content-type", "application/json")])
}

/// Sends `POST /baton/v1/upgrade` with `body` to the server at `base` and
/// returns the open connection without reading the answer: dropping it
/// hangs up on the upgrade.
pub fn upgrade_then_hang_up(base: &str, body: &[u8]) -> std::net::TcpStream {
    let address = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).expect("connecting to the server");
    let head = format!(
        "POST /baton/v1/upgrade HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).expect("sending the upgrade");
    stream
}

/// Whether process `pid` is gone: the drill's own test of it (a zombie
/// counts as gone: it serves nothing).
pub use baton_drill::swap::upgrade::gone;

/// The binary under test with its build stamp set to `stamp`: a second,
/// different binary, which reports the version `<package version>+<stamp>`.
pub fn stamped(stamp: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(super::bin()).expect("reading the binary under test");
    let marker = baton_server::build::STAMP_MARKER;
    let at = bytes.windows(marker.len()).position(|w| w == marker).expect("the build stamp's region") + marker.len();
    assert!(bytes[at..at + stamp.len() + 1].iter().all(|&b| b == 0), "the binary under test is stamped already");
    bytes[at..at + stamp.len()].copy_from_slice(stamp.as_bytes());
    bytes
}

/// A copy of the binary under test at a path of its own, which servers
/// are started from and an upgrade runs again: the test replaces the file
/// there as a package manager would, by writing the new one beside it and
/// renaming it into place.
pub struct Installed {
    dir: tempfile::TempDir,
    /// Where the binary is.
    pub path: PathBuf,
}

impl Installed {
    /// The binary under test, copied into a directory of its own.
    pub fn new() -> Installed {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("baton");
        let installed = Installed { dir, path };
        installed.replace(&std::fs::read(super::bin()).expect("reading the binary under test"));
        installed
    }

    /// A directory beside the binary, for a test's scripts and markers.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `baton serve` from this path on `repo` (see `common::start`).
    pub fn start(&self, repo: &TestRepo, args: &[&str]) -> Server {
        Server::start(&self.path, repo.root(), args)
    }

    /// Puts `bytes` (made executable) at the binary's path, atomically.
    pub fn replace(&self, bytes: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let next = self.dir.path().join(".baton.next");
        std::fs::write(&next, bytes).expect("writing the new binary");
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).expect("making it executable");
        std::fs::rename(&next, &self.path).expect("renaming the new binary into place");
    }

    /// Puts a shell script at the binary's path: a stand-in for a binary
    /// that behaves as `body` says.
    pub fn replace_with_script(&self, body: &str) {
        self.replace(format!("#!/bin/sh\n{body}\n").as_bytes());
    }
}
