//! A systemd to test the package under: Debian's systemd as PID 1 in a
//! podman container of its own, with the package built from the binary
//! under test installed by `dpkg -i`, and the service's ports on the host's
//! loopback (the container shares the host's network). The container is
//! removed, by name, when the [`Service`] is dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use baton_testkit::podman::{Container, Run, share_read_only};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, free_port};

use super::PATIENCE;

/// The workspace's root, where the scripts are.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a script of the workspace and returns its last line of output.
fn script(name: &str, args: &[&str]) -> String {
    let output = Command::new(workspace().join("scripts").join(name))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{name} could not run: {e}"));
    assert!(output.status.success(), "{name} failed: {}", output.status);
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().last().unwrap_or_else(|| panic!("{name} printed nothing")).trim().to_owned()
}

/// The systemd image's name, built once per machine (cached by the script).
fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| script("systemd-test-image.sh", &[]))
}

/// The directory holding the package built from the binary under test.
fn package() -> &'static (PathBuf, String) {
    static PACKAGE: OnceLock<(PathBuf, String)> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("systemd-deb");
        let deb = script(
            "package-deb.sh",
            &["--binary", env!("CARGO_BIN_EXE_baton"), "--out", out.to_str().expect("a UTF-8 path")],
        );
        let deb = PathBuf::from(deb);
        let file = deb.file_name().expect("the package's file name").to_string_lossy().into_owned();
        (deb.parent().expect("the package's directory").to_owned(), file)
    })
}

/// A package of a second binary: the binary under test stamped with
/// `stamp` (so that it reports `<version>+<stamp>`), packaged as that
/// version, which Debian orders after the plain one. Returns its directory
/// and file name.
pub fn stamped_package(stamp: &str) -> (PathBuf, String) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("systemd-deb-{stamp}"));
    std::fs::create_dir_all(&dir).expect("the package's directory");
    let binary = dir.join("baton");
    std::fs::write(&binary, super::common::upgrade::stamped(stamp)).expect("writing the stamped binary");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("making the binary executable");
    let version = format!("{}+{stamp}", env!("CARGO_PKG_VERSION"));
    let deb = PathBuf::from(script(
        "package-deb.sh",
        &[
            "--binary",
            binary.to_str().expect("a UTF-8 path"),
            "--out",
            dir.to_str().expect("a UTF-8 path"),
            "--version",
            &version,
        ],
    ));
    let file = deb.file_name().expect("the package's file name").to_string_lossy().into_owned();
    (dir, file)
}

/// The baton service, installed from the package in a container booted
/// with systemd.
pub struct Service {
    container: Container,
    http: u16,
    admin: u16,
}

impl Service {
    /// Boots a container named after `label`, waits for systemd to be up,
    /// installs the package and points `/etc/default/baton` at `repo`
    /// (mounted read-only at the default repository path) and free ports.
    pub fn install(label: &str, repo: &TestRepo) -> Service {
        Service::install_mounting(label, repo, &[])
    }

    /// The same, with more host directories mounted read-only in the
    /// container: `(host, container)` pairs.
    pub fn install_mounting(label: &str, repo: &TestRepo, mounts: &[(&Path, &str)]) -> Service {
        Service::install_after(label, repo, mounts, "true")
    }

    /// The same, running the shell script `before` in the container just
    /// before the package is installed.
    pub fn install_after(label: &str, repo: &TestRepo, mounts: &[(&Path, &str)], before: &str) -> Service {
        let (deb_dir, deb_file) = package();
        // The repository's directory is private to the test's user; the
        // service's user must be able to read it.
        share_read_only(repo.root());
        let mut run = Run::of_image(image(), &format!("systemd-{label}"))
            // Without SYS_ADMIN systemd cannot make the unit's mount, IPC
            // and UTS namespaces, and runs the service without its sandbox.
            .flags(&["--systemd=always", "--cap-add", "SYS_ADMIN"])
            .mount_read_only(repo.root(), "/srv/baton/models")
            .mount_read_only(deb_dir, "/deb")
            .args(&["/sbin/init"]);
        for (host, inside) in mounts {
            run = run.mount_read_only(host, inside);
        }
        let container = run.start();
        let mut service = Service { container, http: 0, admin: 0 };
        service.wait_for("systemd to boot", || {
            let state = service.exec(&["systemctl", "is-system-running"]);
            let state = String::from_utf8_lossy(&state.stdout).trim().to_owned();
            matches!(state.as_str(), "running" | "degraded").then_some(())
        });
        service.exec_ok(before);
        service.exec_ok(&format!("dpkg -i /deb/{deb_file}"));
        service.choose_ports();
        service
    }

    /// Points `/etc/default/baton` at free loopback ports.
    fn choose_ports(&mut self) {
        let (http, grpc, admin) = (free_port(), free_port(), free_port());
        self.exec_ok(&format!(
            "sed -i -e 's/^BATON_HTTP=.*/BATON_HTTP=127.0.0.1:{http}/' -e 's/^BATON_GRPC=.*/BATON_GRPC=127.0.0.1:{grpc}/' \
             -e 's/^BATON_ADMIN_HTTP=.*/BATON_ADMIN_HTTP=127.0.0.1:{admin}/' /etc/default/baton"
        ));
        (self.http, self.admin) = (http, admin);
    }

    /// `systemctl start baton`, which must succeed; starts again on other
    /// ports when one was taken between the test choosing it and baton
    /// binding it.
    pub fn start(&mut self) {
        for _ in 0..3 {
            if self.exec(&["systemctl", "start", "baton"]).status.success() {
                return;
            }
            assert!(self.journal().contains("Address already in use"), "the start failed:\n{}", self.journal());
            self.exec_ok("systemctl reset-failed baton");
            self.choose_ports();
        }
        panic!("three starts in a row found a port taken:\n{}", self.journal());
    }

    /// The admin listener's address.
    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin)
    }

    /// The REST address the service serves on.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// Runs a command in the container.
    pub fn exec(&self, command: &[&str]) -> Output {
        self.container.exec(command)
    }

    /// Runs a shell script in the container, and returns its output; it
    /// must succeed.
    pub fn exec_ok(&self, script: &str) -> String {
        let output = self.exec(&["sh", "-c", script]);
        assert!(
            output.status.success(),
            "`{script}` failed ({}): {}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.journal()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `systemctl ARGS`, which must succeed.
    pub fn systemctl(&self, args: &[&str]) {
        self.exec_ok(&format!("systemctl {}", args.join(" ")));
    }

    /// A property of the unit, as `systemctl show` gives it.
    pub fn property(&self, name: &str) -> String {
        self.exec_ok(&format!("systemctl show --property {name} --value baton")).trim().to_owned()
    }

    /// The unit's active and sub state.
    pub fn state(&self) -> (String, String) {
        (self.property("ActiveState"), self.property("SubState"))
    }

    /// The pid systemd holds for the service's main process (0 for none).
    pub fn main_pid(&self) -> u32 {
        self.property("MainPID").parse().expect("MainPID is a number")
    }

    /// The pid of the process that answers on the service's port.
    pub fn served_pid(&self) -> u32 {
        self.served_pid_or_none().expect("the server's status")
    }

    /// The same, or `None` when nothing answers.
    pub fn served_pid_or_none(&self) -> Option<u32> {
        let answer = Client::new(&self.base()).try_get("/baton/v1/status").ok()?;
        (answer.status == 200).then(|| answer.json()["pid"].as_u64().expect("a pid in the status") as u32)
    }

    /// Waits until process `pid` is gone from the container (a zombie
    /// counts as gone).
    pub fn wait_gone(&self, pid: u32) {
        self.wait_for(&format!("process {pid} to exit"), || {
            let output = self.exec(&["sh", "-c", &format!("cat /proc/{pid}/stat 2>/dev/null || true")]);
            let stat = String::from_utf8_lossy(&output.stdout).into_owned();
            // The state is the field after the command's closing parenthesis.
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
            matches!(state, None | Some("Z")).then_some(())
        });
    }

    /// Polls `check` until it returns `Some`, or panics after [`PATIENCE`].
    pub fn wait_for<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(value) = check() {
                return value;
            }
            assert!(Instant::now() < deadline, "gave up waiting for {what}:\n{}", self.journal());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The service's journal.
    pub fn journal(&self) -> String {
        // What the services logged is in the journal files before it is read.
        self.exec(&["journalctl", "--sync"]);
        let output = self.exec(&["journalctl", "--unit", "baton", "--no-pager", "--output", "cat"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `systemctl stop baton`, and checks that the main process `pid`
    /// drained and exited on its own (not SIGKILL), leaving the unit
    /// inactive and not failed.
    pub fn assert_stops_cleanly(&self, pid: u32) {
        self.systemctl(&["stop", "baton"]);
        let journal = self.journal();
        assert_eq!(self.state(), ("inactive".into(), "dead".into()), "{journal}");
        assert_eq!(self.property("Result"), "success", "{journal}");
        self.wait_gone(pid);
        let pid_log = self.log_of(pid);
        assert!(pid_log.contains("Shutting down: not ready from now on"), "{pid} did not drain:\n{journal}");
        assert!(pid_log.contains("baton stopped."), "{pid} did not stop on its own:\n{journal}");
        assert!(!journal.contains("SIGKILL"), "{journal}");
        assert!(!journal.contains("panicked"), "{journal}");
    }

    /// What process `pid` logged in the journal.
    pub fn log_of(&self, pid: u32) -> String {
        self.exec(&["journalctl", "--sync"]);
        self.exec_ok(&format!("journalctl --unit baton --no-pager _PID={pid} --output cat"))
    }

    /// The unit's settings as systemd loaded them, compared with `want`
    /// (property, value): one line per property that differs.
    pub fn property_mismatches(&self, want: &[(&str, &str)]) -> Vec<String> {
        want.iter()
            .filter_map(|(name, value)| {
                let got = self.property(name);
                (got != *value).then(|| format!("{name}={got}, not {value}"))
            })
            .collect()
    }

    /// Checks that process `pid` runs in the unit's sandbox: as the
    /// package's user, without privileges or capabilities, under a system
    /// call filter, with the file system read-only but for its state and
    /// cache directories and a private /tmp.
    pub fn assert_sandboxed(&self, pid: u32) {
        let uid = self.exec_ok("id -u baton").trim().to_owned();
        let status = self.exec_ok(&format!("cat /proc/{pid}/status"));
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in the status of {pid}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(field("Uid"), vec![uid.as_str(); 4], "not the baton user");
        assert_ne!(uid, "0");
        assert_eq!(field("NoNewPrivs"), ["1"]);
        assert_eq!(field("Seccomp"), ["2"], "no system call filter");
        for set in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
            assert_eq!(field(set), ["0000000000000000"], "{set}");
        }
        // Each mount point the process sees, with its own options.
        let mounts = self.exec_ok(&format!("cat /proc/{pid}/mountinfo"));
        // The last mount at `point` (the one the process sees): its root
        // within its file system, and whether it is read-only.
        let mount = |point: &str| {
            mounts
                .lines()
                .rev()
                .find_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    (fields.get(4) == Some(&point))
                        .then(|| (fields[3].to_owned(), fields[5].split(',').any(|o| o == "ro")))
                })
                .unwrap_or_else(|| panic!("{point} is not a mount point of {pid}:\n{mounts}"))
        };
        assert!(mount("/").1, "/ (and so /usr, /etc) is writable by the service:\n{mounts}");
        assert!(!mount("/var/lib/baton").1, "the state directory is read-only");
        assert!(mount("/srv/baton/models").1);
        let tmp = mount("/tmp");
        assert!(!tmp.1 && tmp.0.contains("systemd-private"), "no private /tmp: {tmp:?}");
        // ProtectHome: home directories are empty and inaccessible.
        assert!(mounts.lines().any(|line| line.split_whitespace().nth(4) == Some("/home")), "ProtectHome");
    }
}

/// Inference requests to model `m` from two threads, one on a keep-alive
/// connection and one on a new connection each time, until stopped.
pub struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(u64, Vec<String>)>>,
}

impl Traffic {
    /// Starts sending `body` to the server at `base`.
    pub fn start(base: &str, body: String) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [true, false]
            .into_iter()
            .map(|keep_alive| {
                let (stop, base, body) = (Arc::clone(&stop), base.to_owned(), body.clone());
                std::thread::spawn(move || {
                    let headers = [("content-type", "application/json")];
                    let shared = Client::new(&base);
                    let (mut answered, mut failed) = (0, Vec::new());
                    while !stop.load(Ordering::SeqCst) {
                        let client = if keep_alive { shared.clone() } else { Client::new(&base) };
                        match client.try_post_raw("/v2/models/m/infer", body.as_bytes(), &headers) {
                            Ok(answer) if answer.status == 200 => answered += 1,
                            Ok(answer) => {
                                failed.push(format!("{}: {}", answer.status, super::common::text(&answer.body)))
                            }
                            Err(error) => failed.push(error),
                        }
                        // Paced, so that the new process's load (at the
                        // loader's idle priority) gets a core on a busy
                        // machine.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    (answered, failed)
                })
            })
            .collect();
        Traffic { stop, threads }
    }

    /// Stops, and asserts that requests were answered and none failed.
    pub fn assert_clean(self) {
        self.stop.store(true, Ordering::SeqCst);
        let (mut answered, mut failed) = (0, Vec::new());
        for thread in self.threads {
            let (a, f) = thread.join().expect("a traffic thread");
            answered += a;
            failed.extend(f);
        }
        assert!(failed.is_empty(), "{} requests failed: {failed:?}", failed.len());
        assert!(answered > 0, "no request was answered");
    }
}
