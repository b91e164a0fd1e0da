//! baton's container image under podman, for the black-box tests of the
//! image, the Kubernetes manifests and the systemd unit: the image built
//! once per test binary from the binary under test (`scripts/image.sh`),
//! and containers started with the flags this kind of machine needs, each
//! under a name of its own and removed when dropped.
//!
//! podman and mmdebstrap come from Debian's packages, installed by
//! `scripts/setup-packages.sh`; a test that finds one missing fails saying
//! so, it is never skipped.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::server::PATIENCE;

/// The user (and group) the image runs as.
pub const IMAGE_UID: u32 = 10001;

/// podman's global options for every call: runc, since crun refuses the
/// hybrid cgroup layout of machines like this one, and cgroupfs, since no
/// systemd manages cgroups here. Given to every podman command, not only
/// `run`, so that `stop`, `rm` and `exec` find the container as `run` left it.
pub const GLOBAL_FLAGS: &[&str] = &["--runtime", "runc", "--cgroup-manager", "cgroupfs"];

/// `podman run`'s options for every container: explicit limits on open
/// files and processes, without which runc fails here with "error setting
/// rlimit type 7" (it would copy limits the host's podman cannot raise).
pub const RUN_FLAGS: &[&str] = &["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"];

/// The longest a test's container may run before podman kills it
/// (`podman run --timeout`): a test killed before its `Drop` ran leaves no
/// container running for long. Far above any test's own bounds.
pub const CONTAINER_TIMEOUT_S: u32 = 900;

/// The prefix of every test container's name, which goes on with its label,
/// the pid of the test process that started it and a count.
const CONTAINER_PREFIX: &str = "baton-test-";

/// The name the test images carry; the tag is the build's key.
const TEST_IMAGE: &str = "localhost/baton-test";

/// The label that names the binary a test image was built from, so that a
/// new build replaces the images of earlier builds of that binary.
const BINARY_LABEL: &str = "baton.test.binary";

/// The repository's root (this crate is `crates/baton-testkit`).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the repository's root")
}

/// `podman` with [`GLOBAL_FLAGS`]. Panics, saying how to install them, when
/// podman or runc is missing.
pub fn podman() -> Command {
    let program = crate::installed("podman");
    crate::installed("runc");
    let mut command = Command::new(program);
    command.args(GLOBAL_FLAGS).stdin(Stdio::null());
    command
}

/// Runs podman with `args` and returns its output, whatever its status.
pub fn podman_output(args: &[&str]) -> Output {
    podman().args(args).output().expect("running podman")
}

/// Runs podman with `args`, panics with its stderr unless it succeeds, and
/// returns its stdout, trimmed.
pub fn podman_ok(args: &[&str]) -> String {
    let output = podman_output(args);
    assert!(
        output.status.success(),
        "podman {} failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// baton's image, built from a given binary.
#[derive(Debug)]
pub struct Image {
    name: String,
}

static IMAGE: OnceLock<Image> = OnceLock::new();

impl Image {
    /// The image of `bin` (pass `env!("CARGO_BIN_EXE_baton")`): built by
    /// `scripts/image.sh` the first time a test binary asks, or taken as it
    /// is when an image of the same binary, script, Containerfile and ONNX
    /// Runtime exists already. Builds are serialised across test binaries
    /// by a file lock. Each build dir keeps one test image, as a cache: a
    /// new build removes the ones of the same binary's earlier builds.
    pub fn of(bin: &Path) -> &'static Image {
        IMAGE.get_or_init(|| {
            remove_orphans();
            Image::build(bin)
        })
    }

    fn build(bin: &Path) -> Image {
        crate::installed("mmdebstrap");
        let root = repo_root();
        let bin = bin.canonicalize().unwrap_or_else(|e| panic!("the baton binary {}: {e}", bin.display()));
        let ort = root.join(".baton/lib/libonnxruntime.so");
        let mut hasher = DefaultHasher::new();
        bin.hash(&mut hasher);
        for file in [bin.clone(), ort.clone()] {
            // A rebuilt binary has a new modification time; hashing its
            // hundred megabytes would cost more than it tells.
            if let Ok(meta) = std::fs::metadata(&file) {
                meta.len().hash(&mut hasher);
                meta.modified().ok().hash(&mut hasher);
            }
        }
        for input in ["scripts/image.sh", "deploy/container/Containerfile", "deploy/container/rootfs-hook.sh"] {
            std::fs::read(root.join(input)).unwrap_or_else(|e| panic!("reading {input}: {e}")).hash(&mut hasher);
        }
        let name = format!("{TEST_IMAGE}:{:016x}", hasher.finish());

        let locks = root.join(".baton/images");
        std::fs::create_dir_all(&locks).expect("creating .baton/images");
        let lock = std::fs::File::create(locks.join("test-image.lock")).expect("the test image's lock file");
        lock.lock().expect("locking the test image's lock file");
        if !podman_output(&["image", "exists", &name]).status.success() {
            let label = format!("{BINARY_LABEL}={}", bin.display());
            let output = Command::new("bash")
                .arg(root.join("scripts/image.sh"))
                .arg("--binary")
                .arg(&bin)
                .args(["--tag", &name, "--label", &label])
                .stdin(Stdio::null())
                .output()
                .expect("running scripts/image.sh");
            assert!(
                output.status.success(),
                "scripts/image.sh failed ({}):\n{}\n(it needs podman, runc and mmdebstrap: run \
                 `bash scripts/setup-packages.sh`)",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            // Earlier builds of this binary, unless a container still uses one.
            let filter = format!("label={label}");
            let old = podman_ok(&["images", "--filter", &filter, "--format", "{{.Repository}}:{{.Tag}}"]);
            for stale in old.lines().filter(|line| *line != name && line.starts_with(TEST_IMAGE)) {
                let _ = podman_output(&["rmi", stale]);
            }
        }
        drop(lock);
        Image { name }
    }

    /// The image's name, e.g. `localhost/baton-test:0123456789abcdef`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The image's default command (`CMD`), which a test extends: baton's
    /// options take the last value given, so `[command, "--http", addr]`
    /// runs the default command on another address.
    pub fn command(&self) -> Vec<String> {
        let json = podman_ok(&["image", "inspect", "--format", "{{json .Config.Cmd}}", &self.name]);
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("the image's command {json:?}: {e}"))
    }
}

/// Removes the test containers whose test process is gone (killed before
/// it could remove them): their names end in `-<pid>-<count>`, and no
/// process has that pid now. Containers of tests still running, from this
/// checkout or another, are left alone. Returns the names removed.
pub fn remove_orphans() -> Vec<String> {
    let filter = format!("name=^{CONTAINER_PREFIX}");
    let names = podman_ok(&["ps", "--all", "--filter", &filter, "--format", "{{.Names}}"]);
    let mut removed = Vec::new();
    for name in names.lines().filter(|n| n.starts_with(CONTAINER_PREFIX)) {
        let mut fields = name.rsplit('-');
        let (Some(_count), Some(pid)) = (fields.next(), fields.next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if podman_output(&["rm", "--force", "--volumes", "--time", "0", name]).status.success() {
            removed.push(name.to_owned());
        }
    }
    removed
}

/// Makes `dir` and everything in it readable by anyone (the image's user
/// reads a test's repository, made by root with private permissions).
pub fn share_read_only(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    if meta.file_type().is_symlink() {
        return;
    }
    let add = if meta.is_dir() { 0o555 } else { 0o444 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(meta.permissions().mode() | add))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", dir.display()));
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).expect("reading a directory") {
            share_read_only(&entry.expect("a directory entry").path());
        }
    }
}

/// Gives `dir` (and what it holds) to the image's user, so that a
/// container may write its state there: `chown` as root, or `podman
/// unshare chown` for a rootless podman, whose user namespace maps the
/// image's user to a subordinate id.
pub fn give_to_image_user(dir: &Path) {
    let owner = format!("{IMAGE_UID}:{IMAGE_UID}");
    let path = dir.to_str().expect("a UTF-8 path");
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    let status = if root {
        Command::new("chown").args(["-R", &owner, path]).status().expect("running chown")
    } else {
        podman().args(["unshare", "chown", "-R", &owner, path]).status().expect("running podman unshare")
    };
    assert!(status.success(), "giving {path} to {owner} failed");
}

/// How a container is networked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// The host's network: the test reaches the server on 127.0.0.1, on
    /// the ports it gave it.
    Host,
    /// A network namespace of its own with only a loopback device: nothing
    /// it binds is reachable from outside the container.
    None,
}

/// A container to start: `podman run -d` with [`RUN_FLAGS`] and what the
/// test adds.
#[derive(Debug)]
pub struct Run {
    image: String,
    label: String,
    network: Network,
    volumes: Vec<String>,
    env: Vec<String>,
    flags: Vec<String>,
    args: Vec<String>,
}

impl Run {
    /// A container of `image`; `label` goes into its name (for the logs).
    pub fn new(image: &Image, label: &str) -> Run {
        Run::of_image(image.name(), label)
    }

    /// A container of the image named `image` (one a test built itself,
    /// such as a systemd image).
    pub fn of_image(image: &str, label: &str) -> Run {
        Run {
            image: image.to_owned(),
            label: label.to_owned(),
            network: Network::Host,
            volumes: Vec::new(),
            env: Vec::new(),
            flags: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Its network ([`Network::Host`] unless set).
    pub fn network(mut self, network: Network) -> Run {
        self.network = network;
        self
    }

    /// Mounts `host` at `target`, read-only.
    pub fn mount_read_only(mut self, host: &Path, target: &str) -> Run {
        self.volumes.push(format!("{}:{target}:ro", host.display()));
        self
    }

    /// Mounts `host` at `target`, writable.
    pub fn mount(mut self, host: &Path, target: &str) -> Run {
        self.volumes.push(format!("{}:{target}", host.display()));
        self
    }

    /// Sets an environment variable in the container.
    pub fn env(mut self, name: &str, value: &str) -> Run {
        self.env.push(format!("{name}={value}"));
        self
    }

    /// More options for `podman run` (e.g. `--read-only`, `--user`).
    pub fn flags<S: AsRef<str>>(mut self, flags: &[S]) -> Run {
        self.flags.extend(flags.iter().map(|f| f.as_ref().to_owned()));
        self
    }

    /// The container's arguments (the image's command is replaced by them;
    /// none: the image's command runs).
    pub fn args<S: AsRef<str>>(mut self, args: &[S]) -> Run {
        self.args.extend(args.iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Starts the container, detached, and returns once podman has started
    /// it (not once baton serves: see [`Container::wait_ready`]).
    pub fn start(self) -> Container {
        static COUNT: AtomicU32 = AtomicU32::new(0);
        let label: String =
            self.label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
        let name =
            format!("{CONTAINER_PREFIX}{label}-{}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed));
        let timeout = CONTAINER_TIMEOUT_S.to_string();
        let mut command = podman();
        command.args(["run", "--detach", "--name", &name, "--timeout", &timeout]).args(RUN_FLAGS);
        command.arg(match self.network {
            Network::Host => "--network=host",
            Network::None => "--network=none",
        });
        for volume in &self.volumes {
            command.args(["--volume", volume]);
        }
        for env in &self.env {
            command.args(["--env", env]);
        }
        command.args(&self.flags).arg(&self.image).args(&self.args);
        let output = command.output().expect("running podman run");
        // Named before it is checked: a container podman created but could
        // not start is removed all the same.
        let container = Container { name };
        assert!(
            output.status.success(),
            "podman run failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        container
    }
}

/// A container a test started; removed (by name) when dropped, its log
/// printed first if the test is failing.
#[derive(Debug)]
pub struct Container {
    name: String,
}

impl Container {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `podman exec NAME args…` and returns its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        podman().args(["exec", &self.name]).args(args).output().expect("running podman exec")
    }

    /// [`Container::exec`], panicking with its output unless it succeeds;
    /// returns its stdout.
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let output = self.exec(args);
        assert!(
            output.status.success(),
            "podman exec {} {} failed ({}):\n{}{}",
            self.name,
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What the container wrote so far, stdout then stderr.
    pub fn logs(&self) -> String {
        let output = podman_output(&["logs", &self.name]);
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
    }

    /// A field of `podman inspect`, e.g. `{{.State.Status}}`.
    pub fn inspect(&self, format: &str) -> String {
        podman_ok(&["inspect", "--format", format, &self.name])
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    /// Its processes as (pid in the container, command line), from `podman
    /// top` (which reads them from the host: the image has no `ps`).
    pub fn processes(&self) -> Vec<(u32, String)> {
        let table = podman_ok(&["top", &self.name, "pid", "args"]);
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let line = line.trim_start();
                let (pid, args) = line.split_once(char::is_whitespace)?;
                Some((pid.parse().ok()?, args.trim().to_owned()))
            })
            .collect()
    }

    /// Sends a signal (`TERM`, `USR2`…) to its PID 1.
    pub fn kill(&self, signal: &str) {
        podman_ok(&["kill", "--signal", signal, &self.name]);
    }

    /// `podman stop` (SIGTERM to PID 1, SIGKILL after `grace`), and the exit
    /// code podman recorded.
    pub fn stop(&self, grace: Duration) -> i32 {
        let seconds = grace.as_secs().max(1).to_string();
        podman_ok(&["stop", "--time", &seconds, &self.name]);
        self.wait_exit()
    }

    /// Waits (up to [`PATIENCE`]) for it to exit, and returns its exit code
    /// (128 + n for a process ended by signal n).
    pub fn wait_exit(&self) -> i32 {
        let mut waiter =
            podman().args(["wait", &self.name]).stdout(Stdio::piped()).spawn().expect("running podman wait");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if waiter.try_wait().expect("waiting for podman wait").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = waiter.kill();
                let _ = waiter.wait();
                panic!("container {} still runs after {PATIENCE:?}:\n{}", self.name, self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = waiter.wait_with_output().expect("podman wait's output");
        assert!(output.status.success(), "podman wait {} failed", self.name);
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim().parse().unwrap_or_else(|_| panic!("podman wait printed {text:?}"))
    }

    /// Waits until `GET base/v2/health/ready` answers 200, failing early
    /// with the log if the container stops.
    pub fn wait_ready(&self, base: &str) {
        if let Err(log) = self.try_wait_ready(base) {
            panic!("container {} stopped before it was ready:\n{log}", self.name);
        }
    }

    /// [`Container::wait_ready`], but a container that stops first is an
    /// `Err` with its log (say, to start again on other ports when one was
    /// taken before baton bound it). Panics after [`PATIENCE`].
    pub fn try_wait_ready(&self, base: &str) -> Result<(), String> {
        let client = crate::server::Client::new(base);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if client.try_get("/v2/health/ready").is_ok_and(|a| a.status == 200) {
                return Ok(());
            }
            if !self.running() {
                return Err(self.logs());
            }
            assert!(Instant::now() < deadline, "container {} not ready at {base}:\n{}", self.name, self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- log of container {} ---\n{}", self.name, self.logs());
        }
        let _ = podman_output(&["rm", "--force", "--volumes", "--time", "0", &self.name]);
    }
}
