//! Who may manage models, and where: the admin token, the admin listeners,
//! the model-control mode, and the check at start that management is not
//! left open on a public address.
//!
//! Every route and RPC has a [`Scope`]. Open ones (health, server metadata,
//! metrics, status, the index, events) are served on every listener to
//! anyone. Inference is served on the inference listeners only. Posting
//! outcomes is served there too, and needs the outcomes token when one is
//! set (`--outcomes-token-file`): what is posted decides canaries, so it
//! can be kept from clients that may only ask for answers. Management
//! (load, unload, rollback, retire) is served on the admin listeners when
//! there are any, else on the inference listeners; it needs the admin token
//! when one is set, and is refused under `--model-control none`. The
//! server scope (the upgrade, which runs a program) follows management's
//! listener and token rules, and is refused on a listener bound to an
//! address that is not loopback unless the token protects it, whatever the
//! model control and `--insecure-management` say. The front ends classify
//! their routes; [`Access::check`] decides, the same way for REST and gRPC.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Class, ServeError};

/// What a route or RPC does, for access control.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Read-only or health: served everywhere, to anyone.
    Open,
    /// Model metadata, configuration, readiness, statistics, inference.
    Inference,
    /// Posting business outcomes of answers, which rollouts' outcome
    /// guards judge: served where inference is, and needing the outcomes
    /// token when one is set.
    Outcomes,
    /// Load, unload, rollback, retire.
    Management,
    /// Operations on the server process itself (its upgrade): the admin
    /// listener and token rules of management, but not the refusals of
    /// model operations (a fleet's replica, `--model-control none`), since
    /// the models that serve do not change.
    Server,
}

/// Which requests must name an address, not a name, in `Host` (see
/// [`Access::host_check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCheck {
    /// None: a token protects management.
    Never,
    /// Those a browser sends (with `Origin` or `Sec-Fetch-Site`).
    Browsers,
    /// Every one.
    Always,
}

/// The protocol a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// REST (`--http`, `--admin-http`).
    Rest,
    /// gRPC (`--grpc`, `--admin-grpc`).
    Grpc,
}

/// The role of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// `--http` or `--grpc`: KServe V2 for clients.
    Inference,
    /// `--admin-http` or `--admin-grpc`: management for operators.
    Admin,
}

/// How models come and go (`--model-control`), as in Triton.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelControl {
    /// Every model loads at start, the repository is polled for new and
    /// removed versions, and the API may load, unload, roll back and retire.
    #[default]
    Poll,
    /// Only the models named by `--load-model` load at start; no polling;
    /// the API loads and unloads.
    Explicit,
    /// Every model loads at start; no polling; the API's model operations
    /// are refused.
    None,
}

impl ModelControl {
    /// The mode as `--model-control` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelControl::Poll => "poll",
            ModelControl::Explicit => "explicit",
            ModelControl::None => "none",
        }
    }
}

pub use baton_protocol::token::read_token_file;

/// The admin token, kept only as its SHA-256 digest.
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    /// The token `text`.
    pub fn new(text: &str) -> Token {
        Token { digest: Sha256::digest(text.as_bytes()).into() }
    }

    /// Whether `presented` is the token. The comparison takes the same time
    /// whatever the presented token holds and however long it is: both
    /// sides are digests of fixed length, compared in constant time
    /// (`subtle`, which keeps the optimiser from adding an early exit).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let theirs: [u8; 32] = Sha256::digest(presented).into();
        self.digest.ct_eq(&theirs).into()
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any
/// case), or `None` for another scheme.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Set on a request whose caller may see what only the management scope
/// sees ([`Access::privileged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Privileged(pub bool);

/// The access policy of a server.
pub struct Access {
    token: Option<Token>,
    /// The token posting outcomes needs, when one is set.
    outcomes_token: Option<Token>,
    admin_listener: bool,
    control: ModelControl,
    fleet: bool,
    /// Set while an upgrade of the server runs: model operations wait.
    held: Arc<AtomicBool>,
    /// Whether the listener of each front (REST, gRPC) and role
    /// (inference, admin) binds an address that is not loopback. The
    /// server scope is REST alone.
    public: [[bool; 2]; 2],
}

impl Access {
    /// A policy: management needs `token` when there is one, is served only
    /// on admin listeners when `admin_listener`, and is refused under
    /// [`ModelControl::None`].
    pub fn new(token: Option<Token>, admin_listener: bool, control: ModelControl) -> Access {
        Access {
            token,
            admin_listener,
            control,
            fleet: false,
            held: Arc::default(),
            public: [[false; 2]; 2],
            outcomes_token: None,
        }
    }

    /// The same policy, knowing that the REST listener of `role` binds an
    /// address that is not loopback (`public`): there the server scope
    /// needs the token.
    pub fn exposed(self, role: Listener, public: bool) -> Access {
        self.exposed_on(Front::Rest, role, public)
    }

    /// The same policy, knowing whether the `front` listener of `role`
    /// binds an address that is not loopback (`public`).
    pub fn exposed_on(mut self, front: Front, role: Listener, public: bool) -> Access {
        self.public[front as usize][role as usize] = public;
        self
    }

    /// Whether the server scope is refused on `listener` for want of a
    /// token: it is public and no token is set.
    pub fn server_unprotected(&self, listener: Listener) -> bool {
        self.unprotected(Front::Rest, listener)
    }

    /// Whether the `front` listener of role `listener` is public and no
    /// token is set.
    fn unprotected(&self, front: Front, listener: Listener) -> bool {
        self.token.is_none() && self.public[front as usize][listener as usize]
    }

    /// The same policy, with posting outcomes needing `token`
    /// (`--outcomes-token-file`).
    pub fn with_outcomes_token(mut self, token: Option<Token>) -> Access {
        self.outcomes_token = token;
        self
    }

    /// The switch that holds model operations (409 `upgrade_in_progress`)
    /// while it is on: an upgrade turns it on, so that no operator's
    /// decision reaches this process after the new one read the state file.
    pub fn holder(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.held)
    }

    /// The same policy on a replica of a fleet: its models are what the
    /// fleet commits, so the API's model operations are refused.
    pub fn managed_by_fleet(mut self) -> Access {
        self.fleet = true;
        self
    }

    /// Whether a request on the `front` listener of role `listener`
    /// carrying the `authorization` value given would pass the server
    /// scope's listener and token checks: then open reads (status) show it
    /// their details too, such as the store's URL and the fleet's
    /// endpoints and errors. Without a token, that is a loopback listener
    /// only: `--model-control none` and `--insecure-management` open a
    /// public address to clients, not the server's details.
    pub fn privileged(&self, front: Front, listener: Listener, authorization: Option<&[u8]>) -> bool {
        if listener == Listener::Inference && self.admin_listener {
            return false;
        }
        match &self.token {
            Some(token) => authorization.and_then(bearer).is_some_and(|p| token.matches(p)),
            None => !self.unprotected(front, listener),
        }
    }

    /// Which requests to the REST listener of role `listener` must name
    /// an address in `Host` (and in `Origin`): none when a token protects
    /// management (a page that rebinds its name cannot read the token);
    /// every one on a loopback listener without a token; a browser's on a
    /// public listener without one (opened with `--insecure-management` to
    /// clients that may use names, but not to any web page their browsers
    /// visit).
    pub fn host_check(&self, listener: Listener) -> HostCheck {
        match (self.token.is_some(), self.public[Front::Rest as usize][listener as usize]) {
            (true, _) => HostCheck::Never,
            (false, false) => HostCheck::Always,
            (false, true) => HostCheck::Browsers,
        }
    }

    /// [`Access::host_check`] for posting outcomes, which their own token
    /// protects when one is set.
    pub fn outcomes_host_check(&self, listener: Listener) -> HostCheck {
        match (self.outcomes_token.is_some(), self.public[Front::Rest as usize][listener as usize]) {
            (true, _) => HostCheck::Never,
            (false, false) => HostCheck::Always,
            (false, true) => HostCheck::Browsers,
        }
    }

    /// Whether `listener` is where management is served: the admin
    /// listener when there is one, else the inference listener.
    pub fn serves_management(&self, listener: Listener) -> bool {
        listener == Listener::Admin || !self.admin_listener
    }

    /// Whether requests of `scope` on `listener` pass without a look: the
    /// front ends leave such routes unguarded.
    pub fn is_open(&self, listener: Listener, scope: Scope) -> bool {
        match scope {
            Scope::Open => true,
            Scope::Inference => listener == Listener::Inference,
            Scope::Outcomes => listener == Listener::Inference && self.outcomes_token.is_none(),
            Scope::Management | Scope::Server => false,
        }
    }

    /// Whether a request of `scope` on `listener`, carrying the
    /// `authorization` header value given, may go on. `what` (a path or an
    /// RPC) names it in the log; the token never appears there.
    ///
    /// In this order: the wrong listener is refused (403), then a missing
    /// or wrong token (401), then a model operation under `--model-control
    /// none` (403), so that a client without the token learns nothing about
    /// the server's mode.
    pub fn check(
        &self,
        listener: Listener,
        scope: Scope,
        authorization: Option<&[u8]>,
        what: &str,
    ) -> Result<(), ServeError> {
        match (scope, listener) {
            (Scope::Open, _) | (Scope::Inference, Listener::Inference) => return Ok(()),
            (Scope::Inference | Scope::Outcomes, Listener::Admin) => {
                return Err(wrong_listener(
                    "inference and outcomes are served on the inference listeners, not on the admin listener",
                ));
            }
            (Scope::Outcomes, Listener::Inference) => return self.check_outcomes(authorization, what),
            (Scope::Management | Scope::Server, Listener::Inference) if self.admin_listener => {
                return Err(wrong_listener(
                    "management operations are served on the admin listener only (--admin-http, --admin-grpc), \
                     not on this inference listener",
                ));
            }
            (Scope::Management | Scope::Server, _) => {}
        }
        if let Some(token) = &self.token {
            let presented = authorization.and_then(bearer);
            if !presented.is_some_and(|p| token.matches(p)) {
                tracing::warn!(
                    operation = what,
                    presented = presented.is_some(),
                    "Refused a management request without a valid admin token."
                );
                let message = if presented.is_some() {
                    "the bearer token is not the server's admin token"
                } else {
                    "management operations need the admin token: send 'Authorization: Bearer <token>' \
                     with the token of the server's --admin-token-file"
                };
                return Err(ServeError::new(Class::Unauthorized, "unauthorized", message));
            }
        }
        if scope == Scope::Server {
            if self.server_unprotected(listener) {
                tracing::warn!(operation = what, "Refused an upgrade on a public listener that no token protects.");
                return Err(ServeError::new(
                    Class::Forbidden,
                    "upgrade_unprotected",
                    "replacing the server is refused on this listener: it binds an address that is not loopback \
                     and no admin token protects it. Start baton with --admin-token-file FILE and send the token, \
                     or upgrade through a loopback admin listener (--admin-http 127.0.0.1:PORT), or send SIGUSR2 \
                     to the process on its machine",
                ));
            }
            return Ok(());
        }
        if self.held.load(Ordering::SeqCst) {
            return Err(upgrade_in_progress());
        }
        if self.fleet {
            return Err(ServeError::new(
                Class::Forbidden,
                "fleet_managed",
                "this replica serves what its fleet commits (baton serve --cluster): change versions with \
                 `baton fleet rollout`, not on one replica",
            ));
        }
        if self.control == ModelControl::None {
            return Err(ServeError::new(
                Class::Forbidden,
                "model_control_disabled",
                "models cannot be loaded, unloaded, rolled back or retired: the server runs with \
                 --model-control none (restart it with explicit or poll to manage models)",
            ));
        }
        Ok(())
    }
}

impl Access {
    /// Whether a post of outcomes carrying `authorization` may go on: with
    /// no outcomes token, as inference; with one, only with it.
    fn check_outcomes(&self, authorization: Option<&[u8]>, what: &str) -> Result<(), ServeError> {
        let Some(token) = &self.outcomes_token else { return Ok(()) };
        let presented = authorization.and_then(bearer);
        if presented.is_some_and(|p| token.matches(p)) {
            return Ok(());
        }
        tracing::warn!(
            operation = what,
            presented = presented.is_some(),
            "Refused a post of outcomes without the outcomes token."
        );
        let message = if presented.is_some() {
            "the bearer token is not the server's outcomes token (--outcomes-token-file)"
        } else {
            "posting outcomes needs the outcomes token: send 'Authorization: Bearer <token>' with the token of the \
             server's --outcomes-token-file"
        };
        Err(ServeError::new(Class::Unauthorized, "unauthorized", message))
    }
}

/// The refusal of a model operation while an upgrade runs.
pub(crate) fn upgrade_in_progress() -> ServeError {
    ServeError::new(
        Class::Conflict,
        "upgrade_in_progress",
        "an upgrade of the server is under way: model operations are refused until it ends (try again then; the \
         new process takes over what the state file says)",
    )
}

fn wrong_listener(message: &'static str) -> ServeError {
    ServeError::new(Class::Forbidden, "wrong_listener", message)
}

/// A listener that would serve management operations, for [`check_exposure`].
pub struct Exposed<'a> {
    /// The address it binds.
    pub address: SocketAddr,
    /// The flag that set it, e.g. `--http`.
    pub flag: &'a str,
    /// Its role.
    pub listener: Listener,
}

/// Refuses to start when management would be open to anyone who can reach
/// a non-loopback address: no token, model operations allowed, and no
/// `--insecure-management`. The error says what to do instead.
pub fn check_exposure(
    listeners: &[Exposed<'_>],
    token: bool,
    control: ModelControl,
    insecure: bool,
) -> anyhow::Result<()> {
    if token || control == ModelControl::None {
        return Ok(());
    }
    for exposed in listeners.iter().filter(|l| !l.address.ip().to_canonical().is_loopback()) {
        if insecure {
            tracing::warn!(
                address = %exposed.address,
                "Management operations are open to anyone who can reach a non-loopback address (--insecure-management)."
            );
            continue;
        }
        let instead = match exposed.listener {
            Listener::Inference => {
                "serve them on a loopback admin listener (--admin-http 127.0.0.1:PORT and --admin-grpc 127.0.0.1:PORT)"
            }
            Listener::Admin => "bind the admin listener to a loopback address",
        };
        anyhow::bail!(
            "refusing to start: management operations (load, unload, rollback, retire) would be open to anyone \
             who can reach {} ({} {}), which is not a loopback address. Require a token with --admin-token-file FILE, \
             {instead}, or accept the risk with --insecure-management",
            exposed.address,
            exposed.flag,
            exposed.address
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(token: Option<&str>, admin: bool, control: ModelControl) -> Access {
        Access::new(token.map(Token::new), admin, control)
    }

    fn kind(result: Result<(), ServeError>) -> Option<&'static str> {
        result.err().map(|e| e.kind)
    }

    #[test]
    fn without_a_token_a_browser_must_name_an_address() {
        let loopback = access(None, false, ModelControl::Poll);
        assert_eq!(loopback.host_check(Listener::Inference), HostCheck::Always);
        let public = access(None, false, ModelControl::Poll).exposed_on(Front::Rest, Listener::Inference, true);
        assert_eq!(public.host_check(Listener::Inference), HostCheck::Browsers, "clients that use names pass");
        let token = access(Some("t"), false, ModelControl::Poll);
        assert_eq!(token.host_check(Listener::Inference), HostCheck::Never, "the token protects it");
    }

    #[test]
    fn the_token_matches_only_itself() {
        let token = Token::new("s3cret");
        assert!(token.matches(b"s3cret"));
        for other in [&b""[..], b"s3cre", b"s3cret ", b"S3cret", b"s3cret2"] {
            assert!(!token.matches(other), "{other:?}");
        }
    }

    #[test]
    fn bearer_values_parse_with_any_case_of_the_scheme() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearerabc"), None);
    }

    #[test]
    fn management_needs_the_token_then_the_mode() {
        let a = access(Some("t"), false, ModelControl::Poll);
        let (l, m) = (Listener::Inference, Scope::Management);
        assert_eq!(kind(a.check(l, m, None, "x")), Some("unauthorized"));
        assert_eq!(kind(a.check(l, m, Some(b"Bearer u"), "x")), Some("unauthorized"));
        assert_eq!(kind(a.check(l, m, Some(b"Bearer t"), "x")), None);
        assert_eq!(kind(a.check(l, Scope::Open, None, "x")), None);
        assert_eq!(kind(a.check(l, Scope::Inference, None, "x")), None);
        let none = access(Some("t"), false, ModelControl::None);
        assert_eq!(kind(none.check(l, m, None, "x")), Some("unauthorized"));
        assert_eq!(kind(none.check(l, m, Some(b"Bearer t"), "x")), Some("model_control_disabled"));
        let open = access(None, false, ModelControl::Explicit);
        assert_eq!(kind(open.check(l, m, None, "x")), None);
    }

    #[test]
    fn the_server_scope_needs_the_token_and_the_admin_listener_but_not_model_control() {
        let fleet = access(Some("t"), true, ModelControl::Poll).managed_by_fleet();
        let none = access(Some("t"), true, ModelControl::None);
        for a in [&fleet, &none] {
            assert_eq!(kind(a.check(Listener::Admin, Scope::Server, None, "x")), Some("unauthorized"));
            assert_eq!(
                kind(a.check(Listener::Inference, Scope::Server, Some(b"Bearer t"), "x")),
                Some("wrong_listener")
            );
            assert_eq!(kind(a.check(Listener::Admin, Scope::Server, Some(b"Bearer t"), "x")), None);
        }
        assert_eq!(
            kind(fleet.check(Listener::Admin, Scope::Management, Some(b"Bearer t"), "x")),
            Some("fleet_managed")
        );
        assert!(!fleet.is_open(Listener::Admin, Scope::Server) && !fleet.is_open(Listener::Inference, Scope::Server));
    }

    #[test]
    fn the_server_scope_on_a_public_listener_needs_the_token_whatever_the_mode() {
        let s = Scope::Server;
        for control in [ModelControl::None, ModelControl::Poll, ModelControl::Explicit] {
            let open = access(None, false, control).exposed(Listener::Inference, true);
            assert_eq!(kind(open.check(Listener::Inference, s, None, "x")), Some("upgrade_unprotected"), "{control:?}");
            assert_eq!(kind(open.check(Listener::Inference, Scope::Inference, None, "x")), None, "the rest serves");
            let token = access(Some("t"), false, control).exposed(Listener::Inference, true);
            assert_eq!(kind(token.check(Listener::Inference, s, None, "x")), Some("unauthorized"));
            assert_eq!(kind(token.check(Listener::Inference, s, Some(b"Bearer t"), "x")), None);
            let loopback = access(None, false, control);
            assert_eq!(kind(loopback.check(Listener::Inference, s, None, "x")), None);
        }
        // A loopback admin listener takes the upgrade off the public port.
        let admin = access(None, true, ModelControl::Poll).exposed(Listener::Inference, true);
        assert_eq!(kind(admin.check(Listener::Inference, s, None, "x")), Some("wrong_listener"));
        assert_eq!(kind(admin.check(Listener::Admin, s, None, "x")), None);
        let public_admin = admin.exposed(Listener::Admin, true);
        assert_eq!(kind(public_admin.check(Listener::Admin, s, None, "x")), Some("upgrade_unprotected"));
    }

    #[test]
    fn details_are_for_the_token_or_a_loopback_listener_of_the_right_role() {
        let (i, a, t) = (Listener::Inference, Listener::Admin, Some(&b"Bearer t"[..]));
        for front in [Front::Rest, Front::Grpc] {
            let loopback = access(None, false, ModelControl::None);
            assert!(loopback.privileged(front, i, None), "{front:?}");
            let public = access(None, false, ModelControl::None).exposed_on(front, i, true);
            assert!(!public.privileged(front, i, None), "{front:?}: a public listener without a token");
            let token = access(Some("t"), false, ModelControl::None).exposed_on(front, i, true);
            assert!(token.privileged(front, i, t) && !token.privileged(front, i, None), "{front:?}");
            let admin = access(None, true, ModelControl::Poll).exposed_on(front, i, true);
            assert!(!admin.privileged(front, i, None) && admin.privileged(front, a, None), "{front:?}");
        }
        // Each front is judged by its own address.
        let grpc_public = access(None, false, ModelControl::None).exposed_on(Front::Grpc, i, true);
        assert!(grpc_public.privileged(Front::Rest, i, None) && !grpc_public.privileged(Front::Grpc, i, None));
    }

    #[test]
    fn model_operations_are_held_while_an_upgrade_runs() {
        let a = access(Some("t"), false, ModelControl::Poll);
        let (l, m, t) = (Listener::Inference, Scope::Management, Some(&b"Bearer t"[..]));
        a.holder().store(true, Ordering::SeqCst);
        assert_eq!(kind(a.check(l, m, None, "x")), Some("unauthorized"), "the token first");
        assert_eq!(kind(a.check(l, m, t, "x")), Some("upgrade_in_progress"));
        assert_eq!(kind(a.check(l, Scope::Server, t, "x")), None);
        assert_eq!(kind(a.check(l, Scope::Inference, None, "x")), None);
        a.holder().store(false, Ordering::SeqCst);
        assert_eq!(kind(a.check(l, m, t, "x")), None);
    }

    #[test]
    fn outcomes_are_open_as_inference_until_they_have_a_token_of_their_own() {
        let (l, o) = (Listener::Inference, Scope::Outcomes);
        let open = access(Some("admin"), false, ModelControl::Poll);
        assert!(open.is_open(l, o) && !open.is_open(Listener::Admin, o));
        assert_eq!(kind(open.check(l, o, None, "x")), None);
        let guarded = access(Some("admin"), false, ModelControl::Poll).with_outcomes_token(Some(Token::new("o")));
        assert!(!guarded.is_open(l, o));
        for refused in [None, Some(&b"Bearer admin"[..]), Some(b"Bearer x"), Some(b"Basic o")] {
            assert_eq!(kind(guarded.check(l, o, refused, "x")), Some("unauthorized"), "{refused:?}");
        }
        assert_eq!(kind(guarded.check(l, o, Some(b"Bearer o"), "x")), None);
        assert_eq!(kind(guarded.check(Listener::Admin, o, Some(b"Bearer o"), "x")), Some("wrong_listener"));
        assert_eq!(kind(guarded.check(l, Scope::Inference, None, "x")), None, "inference needs no token");
    }

    #[test]
    fn an_admin_listener_takes_management_and_leaves_inference() {
        let a = access(None, true, ModelControl::Poll);
        let m = Scope::Management;
        assert_eq!(kind(a.check(Listener::Inference, m, None, "x")), Some("wrong_listener"));
        assert_eq!(kind(a.check(Listener::Admin, m, None, "x")), None);
        assert_eq!(kind(a.check(Listener::Admin, Scope::Inference, None, "x")), Some("wrong_listener"));
        assert_eq!(kind(a.check(Listener::Admin, Scope::Open, None, "x")), None);
        assert!(a.is_open(Listener::Inference, Scope::Inference) && !a.is_open(Listener::Admin, Scope::Inference));
    }

    #[test]
    fn public_management_without_protection_is_refused() {
        let public = |flag, listener| Exposed { address: "0.0.0.0:8000".parse().unwrap(), flag, listener };
        let local =
            Exposed { address: "127.0.0.1:8000".parse().unwrap(), flag: "--http", listener: Listener::Inference };
        let mapped =
            Exposed { address: "[::ffff:127.0.0.1]:1".parse().unwrap(), flag: "--http", listener: Listener::Inference };
        assert!(check_exposure(&[local, mapped], false, ModelControl::Poll, false).is_ok());
        let error = check_exposure(&[public("--http", Listener::Inference)], false, ModelControl::Poll, false)
            .unwrap_err()
            .to_string();
        for needle in ["0.0.0.0:8000", "--http", "--admin-token-file", "--admin-http", "--insecure-management"] {
            assert!(error.contains(needle), "{needle}: {error}");
        }
        assert!(check_exposure(&[public("--admin-http", Listener::Admin)], false, ModelControl::Poll, false).is_err());
        assert!(check_exposure(&[public("--http", Listener::Inference)], true, ModelControl::Poll, false).is_ok());
        assert!(check_exposure(&[public("--http", Listener::Inference)], false, ModelControl::None, false).is_ok());
        assert!(check_exposure(&[public("--http", Listener::Inference)], false, ModelControl::Poll, true).is_ok());
    }

    #[test]
    fn token_files_are_trimmed_and_must_hold_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  abc\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), "abc");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_token_file(&path).unwrap_err().to_string().contains("is empty"));
        std::fs::write(&path, "a b").unwrap();
        assert!(read_token_file(&path).is_err());
        assert!(read_token_file(&dir.path().join("missing")).is_err());
    }
}
