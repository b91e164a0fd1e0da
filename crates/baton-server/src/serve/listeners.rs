//! Where the server's listening sockets come from: passed to it already
//! listening (systemd socket activation: `LISTEN_PID`, `LISTEN_FDS` and
//! `LISTEN_FDNAMES`), or bound from its flags.
//!
//! The variables are read by the `sd-notify` crate, as systemd's
//! `sd_listen_fds_with_names` reads them (only when `LISTEN_PID` names this
//! process; every descriptor marked close-on-exec); baton then decides what
//! each socket stands for.
//!
//! A socket passed in keeps listening while the server restarts: the
//! process manager holds it, connections queue in its backlog, and the
//! next server takes them. Sockets are named after the listener they
//! stand for: `http`, `grpc`, `admin-http` and `admin-grpc`. Without names
//! they are taken in that order. A passed socket replaces its flag's
//! address; a passed admin socket opens that admin listener even without
//! its flag.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use anyhow::{Context, bail};

use super::ServeArgs;

/// The listeners' names, in the order unnamed sockets are taken.
pub const NAMES: [&str; 4] = ["http", "grpc", "admin-http", "admin-grpc"];

/// A listener, and the address it listens on.
pub type Listener = (tokio::net::TcpListener, SocketAddr);

/// The server's listeners.
pub struct Listeners {
    /// KServe V2 over HTTP.
    pub http: Listener,
    /// KServe V2 over gRPC.
    pub grpc: Listener,
    /// The management API over HTTP, when it listens apart.
    pub admin_http: Option<Listener>,
    /// The management API over gRPC, when it listens apart.
    pub admin_grpc: Option<Listener>,
}

/// Listening sockets passed to this process, each with the listener it
/// stands for and its address.
#[derive(Debug, Default)]
pub struct Passed(Vec<(String, std::net::TcpListener, SocketAddr)>);

impl Passed {
    /// Takes the sockets passed to this process, when `LISTEN_PID` names
    /// it. Each must be a TCP socket that listens. They are closed on exec
    /// from now on, so that no worker process holds them. The variables
    /// stay: a child has another pid, so it takes nothing.
    pub fn from_env() -> anyhow::Result<Passed> {
        let given = sd_notify::listen_fds_with_names().context("reading the sockets passed in (LISTEN_FDS)")?;
        let passed = named(given.collect()).map_err(anyhow::Error::msg)?;
        // SAFETY: the process that started this one left each descriptor
        // open for it (LISTEN_PID names this process), and nothing else
        // here owns it.
        #[allow(unsafe_code)]
        let fds = passed.into_iter().map(|(name, fd)| (name, unsafe { OwnedFd::from_raw_fd(fd) })).collect();
        Passed::from_fds(fds)
    }

    /// Sockets passed to this process or handed over by the server it
    /// replaces, named.
    pub fn from_fds(fds: Vec<(String, OwnedFd)>) -> anyhow::Result<Passed> {
        let mut adopted = Vec::new();
        for (name, fd) in fds {
            anyhow::ensure!(NAMES.contains(&name.as_str()), "a socket named '{name}' was handed over");
            let (listener, address) = adopt(fd).with_context(|| format!("the socket passed as '{name}'"))?;
            adopted.push((name, listener, address));
        }
        Ok(Passed(adopted))
    }

    /// Puts the passed sockets' addresses in place of the flags', so that
    /// what is checked and said of each listener (its exposure, whether
    /// there is an admin listener) is what serves.
    pub fn apply(&self, args: &mut ServeArgs) {
        for (name, _, address) in &self.0 {
            match name.as_str() {
                "http" => args.http = *address,
                "grpc" => args.grpc = *address,
                "admin-http" => args.admin_http = Some(*address),
                _ => args.admin_grpc = Some(*address),
            }
        }
    }

    /// The passed socket named `name`, as the runtime's.
    fn take(&mut self, name: &str) -> anyhow::Result<Option<Listener>> {
        let Some(at) = self.0.iter().position(|(n, _, _)| n == name) else { return Ok(None) };
        let (_, listener, address) = self.0.swap_remove(at);
        Ok(Some((tokio::net::TcpListener::from_std(listener)?, address)))
    }
}

/// The server's listeners: the sockets `passed`, and the rest bound from
/// `args`.
pub async fn open(args: &ServeArgs, mut passed: Passed) -> anyhow::Result<Listeners> {
    let http = match passed.take(NAMES[0])? {
        Some(listener) => listener,
        None => bind(args.http).await?,
    };
    let grpc = match passed.take(NAMES[1])? {
        Some(listener) => listener,
        None => bind(args.grpc).await?,
    };
    let admin_http = match (passed.take(NAMES[2])?, args.admin_http) {
        (Some(listener), _) => Some(listener),
        (None, Some(address)) => Some(bind(address).await?),
        (None, None) => None,
    };
    let admin_grpc = match (passed.take(NAMES[3])?, args.admin_grpc) {
        (Some(listener), _) => Some(listener),
        (None, Some(address)) => Some(bind(address).await?),
        (None, None) => None,
    };
    Ok(Listeners { http, grpc, admin_http, admin_grpc })
}

impl Listeners {
    /// Copies of the listening sockets, named: what this server hands
    /// over to a new binary.
    pub fn copies(&self) -> std::io::Result<Vec<(String, OwnedFd)>> {
        use std::os::fd::AsFd;
        let all = [Some(&self.http), Some(&self.grpc), self.admin_http.as_ref(), self.admin_grpc.as_ref()];
        let named = NAMES.iter().zip(all).filter_map(|(name, listener)| Some((name, listener?)));
        named.map(|(name, (listener, _))| Ok(((*name).to_owned(), listener.as_fd().try_clone_to_owned()?))).collect()
    }
}

/// Binds `address`.
pub async fn bind(address: SocketAddr) -> anyhow::Result<Listener> {
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("binding {address}"))?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

/// A passed descriptor as a listener: it must be a TCP socket that
/// listens. It is closed on exec from now on, so that no worker process
/// holds the server's listening socket.
fn adopt(fd: OwnedFd) -> anyhow::Result<(std::net::TcpListener, SocketAddr)> {
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).context("marking it close-on-exec")?;
    if !rustix::net::sockopt::socket_acceptconn(&fd).context("asking whether it is a listening socket")? {
        bail!("it is not a listening socket");
    }
    let listener = std::net::TcpListener::from(fd);
    let address = listener.local_addr().context("it is not a TCP socket")?;
    listener.set_nonblocking(true)?;
    Ok((listener, address))
}

/// The listener each passed descriptor stands for, from the names it was
/// passed with: by name when one of them is a listener's, else (no names,
/// or systemd's defaults: the socket unit's name, or "unknown") in order.
fn named(given: Vec<(RawFd, String)>) -> Result<Vec<(String, RawFd)>, String> {
    if given.len() > NAMES.len() {
        return Err(format!("LISTEN_FDS = {}: baton listens on at most {} sockets", given.len(), NAMES.len()));
    }
    let by_name = given.iter().any(|(_, n)| NAMES.contains(&n.as_str()));
    let mut sockets: Vec<(String, RawFd)> = Vec::with_capacity(given.len());
    for (i, (fd, given)) in given.into_iter().enumerate() {
        let name = if by_name { given } else { NAMES[i].to_owned() };
        if !NAMES.contains(&name.as_str()) {
            return Err(format!("LISTEN_FDNAMES: '{name}' is none of {}, as other sockets are", NAMES.join(", ")));
        }
        if sockets.iter().any(|(n, _)| *n == name) {
            return Err(format!("LISTEN_FDNAMES: '{name}' is passed twice"));
        }
        sockets.push((name, fd));
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(names: &[&str]) -> Result<Vec<(String, RawFd)>, String> {
        named(names.iter().enumerate().map(|(i, n)| (3 + i as RawFd, (*n).to_owned())).collect())
    }

    #[test]
    fn passed_sockets_are_taken_by_name_or_in_order() {
        let named = read(&["grpc", "http"]).unwrap();
        assert_eq!(named, [("grpc".to_owned(), 3), ("http".to_owned(), 4)]);
        let ordered = read(&["unknown", "unknown", "unknown"]).unwrap();
        assert_eq!(ordered, [("http".to_owned(), 3), ("grpc".to_owned(), 4), ("admin-http".to_owned(), 5)]);
        assert_eq!(read(&["baton.socket", "baton.socket"]).unwrap(), ordered[..2]);
        assert!(read(&[]).unwrap().is_empty());
        for (names, needle) in [
            (&["http", "grpc", "admin-http", "admin-grpc", "x"][..], "at most 4"),
            (&["http", "rest"], "'rest' is none of"),
            (&["http", "http"], "passed twice"),
        ] {
            let error = read(names).unwrap_err();
            assert!(error.contains(needle), "{names:?}: {error}");
        }
    }
}
