//! Helpers of the tests that upgrade the server: asking for an upgrade,
//! following the processes it starts and ends, and a second binary that
//! differs from the one under test.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton_testkit::server::Client;

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

/// Whether process `pid` is gone: the drill's own test of it (a zombie
/// counts as gone: it serves nothing).
pub use baton_drill::swap::upgrade::gone;

/// A copy of the binary under test, in `dir`, whose build stamp is
/// `stamp`: a second, different binary, which reports the version
/// `<package version>+<stamp>`.
pub fn second_binary(dir: &Path, stamp: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let mut bytes = std::fs::read(super::bin()).expect("reading the binary under test");
    let marker = baton_server::build::STAMP_MARKER;
    let at = bytes.windows(marker.len()).position(|w| w == marker).expect("the build stamp's region") + marker.len();
    assert!(bytes[at..at + stamp.len() + 1].iter().all(|&b| b == 0), "the binary under test is stamped already");
    bytes[at..at + stamp.len()].copy_from_slice(stamp.as_bytes());
    let path = dir.join("baton-second");
    std::fs::write(&path, bytes).expect("writing the second binary");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("making it executable");
    path
}
