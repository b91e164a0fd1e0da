//! Requests a browser was made to send: management over REST refuses them
//! whatever the token says, so that no web page an operator has open can
//! act on a server the operator's browser reaches (say, a loopback
//! listener behind an SSH tunnel, which needs no token).
//!
//! - **Cross-site requests.** A browser marks a request another site's
//!   page makes: `Sec-Fetch-Site: cross-site` or `same-site`, and an
//!   `Origin` that is not the server's own. Both are refused. A plain HTML
//!   form or a `no-cors` fetch needs no preflight, so without this any page
//!   could pause, promote or roll back a rollout.
//! - **Renamed hosts (DNS rebinding).** A page can make its own name
//!   resolve to 127.0.0.1; its requests are then same-origin to the
//!   browser. They carry that name in `Host`, though. On a loopback
//!   listener without an admin token, management and the privileged
//!   details of reads are served only to a `Host` that is an IP address or
//!   `localhost`; with a token, the token is what protects them (a rebound
//!   page cannot read it).
//!
//! Clients that are not browsers (curl, the CLI, tritonclient) send
//! neither header and name the address they reach, so nothing changes for
//! them.

use axum::http::{HeaderMap, header};

use crate::access::HostCheck;
use crate::error::{Class, ServeError};

/// Why a request is refused as a browser's, or `None` when it is not
/// refused. `hosts`: which requests must name an address in `Host` and
/// `Origin` ([`crate::access::Access::host_check`]).
pub fn refusal(headers: &HeaderMap, hosts: HostCheck) -> Option<ServeError> {
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if let Some(site) = site
        && (site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site"))
    {
        return Some(cross_site(format!("the browser says another site's page sent it (Sec-Fetch-Site: {site})")));
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).map(|o| o.to_str().unwrap_or(""));
    // A browser that says a request is its page's own is believed: behind
    // a proxy that rewrites `Host`, `Origin` and `Host` differ for the
    // console's own requests. Any other (one that says nothing, or
    // `none`) has its `Origin` compared with `Host`.
    let own_page = site.is_some_and(|s| s.eq_ignore_ascii_case("same-origin"));
    if let Some(origin) = origin.filter(|_| !own_page)
        && host.is_none_or(|host| !same_authority(origin, host))
    {
        return Some(cross_site(format!(
            "it comes from a page of {origin:?}, not of this server ({})",
            host.unwrap_or("no Host header")
        )));
    }
    let browser = site.is_some() || origin.is_some();
    let check = match hosts {
        HostCheck::Never => false,
        HostCheck::Browsers => browser,
        HostCheck::Always => true,
    };
    if !check {
        return None;
    }
    // A rebound page names itself in `Host`, or, behind a proxy that
    // rewrites `Host`, in `Origin`.
    let origin_host = origin.and_then(|o| o.split_once("://")).map(|(_, authority)| authority);
    let named = [host, origin_host].into_iter().flatten().find(|name| !names_this_machine(name))?;
    Some(ServeError::new(
        Class::Forbidden,
        "untrusted_host",
        format!(
            "without a token, management and posted outcomes answer only requests addressed to an IP address \
             or localhost, not {named:?} (a page can make any name reach this server); use the address, or set \
             --admin-token-file (--outcomes-token-file for outcomes)"
        ),
    ))
}

fn cross_site(why: String) -> ServeError {
    ServeError::new(
        Class::Forbidden,
        "cross_site",
        format!("refused a request a browser made for another site: {why}; use baton's own console or a client"),
    )
}

/// Whether `origin` (`scheme://host[:port]`) names the authority `host`
/// (`host[:port]`), ports made explicit on both sides.
fn same_authority(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let explicit = |authority: &str| match split_port(authority) {
        (name, Some(port)) => format!("{}:{port}", name.to_ascii_lowercase()),
        (name, None) => format!("{}:{default}", name.to_ascii_lowercase()),
    };
    explicit(authority) == explicit(host)
}

/// `host[:port]` split into the host (brackets kept for IPv6) and the port.
fn split_port(authority: &str) -> (&str, Option<&str>) {
    let colon = match authority.rfind(']') {
        Some(end) => authority[end..].find(':').map(|i| end + i),
        None => authority.rfind(':'),
    };
    match colon {
        Some(i) => (&authority[..i], Some(&authority[i + 1..])),
        None => (authority, None),
    }
}

/// Whether a `Host` value is an IP address or `localhost`: a name no page
/// can make resolve to this server.
fn names_this_machine(host: &str) -> bool {
    let (name, _) = split_port(host);
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("a header value"));
        }
        map
    }

    fn kind(pairs: &[(&'static str, &str)], check_host: bool) -> Option<&'static str> {
        refusal(&headers(pairs), if check_host { HostCheck::Always } else { HostCheck::Never }).map(|e| e.kind)
    }

    #[test]
    fn clients_that_are_not_browsers_pass() {
        assert_eq!(kind(&[("host", "127.0.0.1:8000")], true), None);
        assert_eq!(kind(&[("host", "localhost:8000")], true), None);
        assert_eq!(kind(&[("host", "[::1]:8000")], true), None);
        assert_eq!(kind(&[("host", "10.1.2.3")], true), None);
        assert_eq!(kind(&[], true), None, "HTTP/1.0 sends no Host");
    }

    #[test]
    fn the_console_on_its_own_origin_passes() {
        let own = [("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8000"), ("sec-fetch-site", "same-origin")];
        assert_eq!(kind(&own, true), None);
        assert_eq!(kind(&[("host", "baton.example:443"), ("origin", "https://baton.example")], false), None);
        assert_eq!(kind(&[("host", "[::1]:9"), ("origin", "http://[::1]:9")], true), None);
    }

    #[test]
    fn another_sites_page_is_refused() {
        assert_eq!(kind(&[("host", "127.0.0.1:8000"), ("sec-fetch-site", "cross-site")], false), Some("cross_site"));
        assert_eq!(kind(&[("host", "127.0.0.1:8000"), ("sec-fetch-site", "same-site")], true), Some("cross_site"));
        assert_eq!(kind(&[("host", "127.0.0.1:8000"), ("origin", "https://evil.example")], false), Some("cross_site"));
        assert_eq!(kind(&[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8001")], true), Some("cross_site"));
        assert_eq!(kind(&[("host", "127.0.0.1:8000"), ("origin", "null")], true), Some("cross_site"));
    }

    #[test]
    fn a_rebound_name_is_refused_without_a_token_only() {
        let rebound = [("host", "evil.example:8000"), ("origin", "http://evil.example:8000")];
        assert_eq!(kind(&rebound, true), Some("untrusted_host"));
        assert_eq!(kind(&rebound, false), None, "the token protects it");
    }

    #[test]
    fn a_rebound_page_behind_a_proxy_names_itself_in_its_origin() {
        let rebound =
            [("host", "127.0.0.1:8000"), ("origin", "http://evil.example"), ("sec-fetch-site", "same-origin")];
        assert_eq!(kind(&rebound, true), Some("untrusted_host"));
        assert_eq!(kind(&rebound, false), None, "the token protects it");
        let none = [("host", "127.0.0.1:8000"), ("origin", "http://evil.example"), ("sec-fetch-site", "none")];
        assert_eq!(kind(&none, false), Some("cross_site"), "only same-origin is taken at its word");
    }

    #[test]
    fn on_a_public_listener_without_a_token_only_browsers_must_name_an_address() {
        let client = headers(&[("host", "baton.ns.svc:8000")]);
        assert!(refusal(&client, HostCheck::Browsers).is_none());
        let browser = headers(&[("host", "evil.example:8000"), ("origin", "http://evil.example:8000")]);
        assert_eq!(refusal(&browser, HostCheck::Browsers).map(|e| e.kind), Some("untrusted_host"));
    }

    #[test]
    fn behind_a_proxy_that_rewrites_host_the_browsers_word_is_taken() {
        let proxied =
            [("host", "127.0.0.1:8081"), ("origin", "https://baton.example"), ("sec-fetch-site", "same-origin")];
        assert_eq!(kind(&proxied, false), None);
        // A browser that says nothing has its Origin compared with Host.
        assert_eq!(kind(&proxied[..2], false), Some("cross_site"));
    }
}
