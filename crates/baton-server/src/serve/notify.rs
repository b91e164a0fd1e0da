//! Telling systemd how the service stands (`sd_notify`), when it runs
//! baton as a `Type=notify` service: `NOTIFY_SOCKET` names a datagram
//! socket, and baton sends it `READY=1` once it first serves every model it
//! must, `STOPPING=1` when it shuts down, and during an upgrade `MAINPID=`
//! with the new process's pid, so that systemd follows the new process
//! rather than counting the old one's exit as the service's end: the old
//! process sends it at the commit, before it drains (so the manager hears
//! of the new main process before the old one exits), and the new process
//! again once it serves (the unit needs `NotifyAccess=all`, since the new
//! process is not the one systemd started). `baton init` listens the same
//! way. Outside a manager, nothing is sent.
//!
//! Sent by hand rather than with the `sd-notify` crate (which baton uses to
//! read passed sockets): its `notify` connects to `NOTIFY_SOCKET` as a
//! path, so a manager that names an abstract socket (`@name`, as systemd's
//! own `sd_notify` accepts and container managers use) would never hear
//! from baton. The protocol is one datagram of `KEY=VALUE` lines.

use std::os::unix::net::UnixDatagram;

/// The variable systemd sets to its notification socket's path.
const SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// Sends `state` (lines of `KEY=VALUE`) to systemd, if it listens. A
/// failure is logged and otherwise ignored: the service serves on.
pub fn notify(state: &str) {
    let Ok(path) = std::env::var(SOCKET_ENV) else { return };
    send_to(&path, state);
}

/// Sends `state` to the notification socket at `path` (`@name` for an
/// abstract one); a failure is logged and otherwise ignored.
pub fn send_to(path: &str, state: &str) {
    if let Err(error) = send(path, state) {
        tracing::warn!(%error, socket = %path, "Could not tell the service manager how the service stands.");
    }
}

fn send(path: &str, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    // A manager that does not read (its buffer full) costs a warning and
    // this notification, never a wait: `baton init` sends on its only
    // thread.
    socket.set_nonblocking(true)?;
    // A leading '@' names a socket in the abstract namespace.
    if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        socket.send_to_addr(state.as_bytes(), &address)?;
    } else {
        socket.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// Sends `READY=1` (with `MAINPID=` when `upgraded`) once `app` first
/// reports ready.
pub async fn when_ready(app: std::sync::Arc<crate::app::App>, upgraded: bool) {
    if std::env::var_os(SOCKET_ENV).is_none() {
        return;
    }
    while !app.ready() {
        if app.draining() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    if upgraded {
        notify(&format!("MAINPID={}\nREADY=1", std::process::id()));
    } else {
        notify("READY=1");
    }
}
