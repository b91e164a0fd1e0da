//! The address the drill targets: parsed once, resolved once, and refused
//! when it is not loopback unless the user allowed remote targets. The
//! drill sends traffic nowhere else.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::{Context, bail, ensure};

/// A parsed `http://host:port[/prefix]` address.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// What the user gave, without a trailing `/`.
    pub base: String,
    /// The resolved socket address connections go to.
    pub addr: SocketAddr,
    /// The value of the `Host` header.
    pub host: String,
    /// A path prefix before `/v2/...` (empty for most servers).
    pub prefix: String,
}

impl Endpoint {
    /// Parses and resolves `url`; refuses a non-loopback address unless
    /// `allow_remote`.
    pub fn parse(url: &str, default_port: u16, allow_remote: bool) -> anyhow::Result<Endpoint> {
        let base = url.trim_end_matches('/').to_owned();
        let Some(rest) = base.strip_prefix("http://") else {
            bail!("'{url}' is not an http:// address (https is not supported)");
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, String::new()),
        };
        ensure!(!authority.is_empty(), "'{url}' has no host");
        let has_port = authority.rsplit_once(':').is_some_and(|(h, p)| !h.ends_with(':') && p.parse::<u16>().is_ok())
            && !authority.ends_with(']');
        let with_port = if has_port { authority.to_owned() } else { format!("{authority}:{default_port}") };
        let addrs: Vec<SocketAddr> =
            with_port.to_socket_addrs().with_context(|| format!("resolving {with_port}"))?.collect();
        let Some(&addr) = addrs.first() else { bail!("{with_port} resolves to no address") };
        if let Some(remote) = addrs.iter().find(|a| !a.ip().is_loopback())
            && !allow_remote
        {
            bail!(
                "{url} resolves to {remote}, which is not a loopback address; the drill puts heavy load on its \
                 target, so pass --allow-remote to drill a server on another machine"
            );
        }
        let host = authority.to_owned();
        Ok(Endpoint { base, addr, host, prefix })
    }

    /// The full URL of `path` (which starts with `/`), for blocking clients.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// Checks that a model name or version can go into a URL path as is.
pub fn check_path_segment(what: &str, value: &str) -> anyhow::Result<()> {
    let bad = value.is_empty()
        || value.bytes().any(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'+' | b'@')));
    ensure!(!bad, "{what} '{value}' cannot be used in a URL path as is");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loopback_addresses() {
        let e = Endpoint::parse("http://127.0.0.1:8000/", 80, false).unwrap();
        assert_eq!((e.addr.port(), e.host.as_str(), e.prefix.as_str()), (8000, "127.0.0.1:8000", ""));
        let e = Endpoint::parse("http://localhost/seldon/ns", 8000, false).unwrap();
        assert_eq!((e.addr.port(), e.prefix.as_str()), (8000, "/seldon/ns"));
        assert!(e.addr.ip().is_loopback());
        let e = Endpoint::parse("http://[::1]:9000", 80, false).unwrap();
        assert_eq!(e.addr.port(), 9000);
    }

    #[test]
    fn refuses_remote_and_other_schemes() {
        let e = Endpoint::parse("http://10.1.2.3:8000", 80, false).unwrap_err().to_string();
        assert!(e.contains("--allow-remote"), "{e}");
        assert!(Endpoint::parse("http://10.1.2.3:8000", 80, true).is_ok());
        assert!(Endpoint::parse("https://127.0.0.1", 80, false).is_err());
    }

    #[test]
    fn path_segments() {
        assert!(check_path_segment("model", "ranker-v2_x.1").is_ok());
        assert!(check_path_segment("model", "a/b").is_err());
        assert!(check_path_segment("model", "").is_err());
    }
}
