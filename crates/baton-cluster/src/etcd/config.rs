//! How to reach a fleet's etcd: endpoints, TLS and credentials. Secrets
//! come from files, read at each connection, so that they never appear on
//! a command line and a rotated file is picked up at the next reconnect.

use std::path::PathBuf;

use crate::error::ClusterError;

/// Where a fleet's etcd is and how to speak to it.
#[derive(Clone, Debug, Default)]
pub struct StoreConfig {
    /// `etcd://HOST:PORT[,HOST:PORT…]` (or `http://…`, `https://…`).
    pub endpoints: String,
    /// TLS, when etcd serves it; then no endpoint is spoken to in plaintext.
    pub tls: Option<TlsFiles>,
    /// etcd's user name, when etcd has authentication on.
    pub user: Option<String>,
    /// A file holding the user's password.
    pub password_file: Option<PathBuf>,
    /// Send the password to an etcd spoken to in plaintext. Refused
    /// unless set: only where something else encrypts the way to etcd (a
    /// service mesh's sidecar, an etcd on the same host).
    pub plaintext_password: bool,
}

/// PEM files for TLS to etcd.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// The certificate authority that signed etcd's certificate.
    pub ca: PathBuf,
    /// This process's client certificate, when etcd asks for one.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
}

impl StoreConfig {
    /// Plaintext, no credentials: a test's or a private network's etcd.
    pub fn plain(endpoints: &str) -> StoreConfig {
        StoreConfig { endpoints: endpoints.to_owned(), ..StoreConfig::default() }
    }

    /// The endpoint URLs, each `http://` or `https://` by the TLS setting.
    /// A plaintext URL is refused when TLS is configured, and an `https`
    /// one when it is not: the scheme never decides alone.
    pub fn urls(&self) -> Result<Vec<String>, ClusterError> {
        let spec = self.endpoints.trim();
        let (scheme, rest) = match spec.split_once("://") {
            Some((scheme, rest)) => (scheme, rest),
            None => ("etcd", spec),
        };
        let tls = self.tls.is_some();
        match (scheme, tls) {
            ("etcd", _) | ("http", false) | ("https", true) => {}
            ("http", true) => {
                return Err(ClusterError::Refused(format!(
                    "'{spec}' is plaintext, but TLS to etcd is configured: use etcd:// or https://"
                )));
            }
            ("https", false) => {
                return Err(ClusterError::Refused(format!(
                    "'{spec}' asks for TLS: give the certificate authority with --etcd-ca"
                )));
            }
            (other, _) => {
                return Err(ClusterError::Refused(format!(
                    "'{other}://' is not an etcd scheme; use etcd://HOST:PORT[,HOST:PORT]"
                )));
            }
        }
        let scheme = if tls { "https" } else { "http" };
        let urls: Vec<String> =
            rest.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| format!("{scheme}://{s}")).collect();
        if urls.is_empty() {
            return Err(ClusterError::Refused(format!(
                "'{spec}' names no etcd endpoint; use etcd://HOST:PORT[,HOST:PORT]"
            )));
        }
        Ok(urls)
    }

    /// The user and password, read from the password file; none without
    /// a user.
    pub fn credentials(&self) -> Result<Option<(String, String)>, ClusterError> {
        let Some(user) = &self.user else {
            if self.password_file.is_some() {
                return Err(ClusterError::Refused("a password file needs a user (--etcd-user)".into()));
            }
            return Ok(None);
        };
        let file = self.password_file.as_ref().ok_or_else(|| {
            ClusterError::Refused(format!("etcd user {user} needs a password file (--etcd-password-file)"))
        })?;
        let password = read_secret(file)?;
        Ok(Some((user.clone(), password)))
    }

    /// Checks what can be checked before connecting: the endpoints parse,
    /// every file named can be read, and no password would go out in
    /// plaintext.
    pub fn check(&self) -> Result<(), ClusterError> {
        self.check_access()?;
        self.credentials()?;
        if let Some(tls) = &self.tls {
            tls.read()?;
        }
        Ok(())
    }

    /// Refuses a password that would be sent in plaintext: without TLS,
    /// anyone on the way to etcd reads it, and with it may rewrite what
    /// every replica serves. `plaintext_password` lets it go.
    pub(crate) fn check_access(&self) -> Result<(), ClusterError> {
        self.urls()?;
        match &self.user {
            Some(user) if self.tls.is_none() && !self.plaintext_password => Err(ClusterError::Refused(format!(
                "etcd user {user} would send its password in plaintext: give etcd's certificate authority \
                 with --etcd-ca to speak TLS, or, where something else encrypts the way to etcd, \
                 --etcd-plaintext-password"
            ))),
            _ => Ok(()),
        }
    }
}

/// A secret from a file, without its trailing newline; an empty one is
/// refused.
pub fn read_secret(file: &std::path::Path) -> Result<String, ClusterError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| ClusterError::Refused(format!("reading the secret in {}: {e}", file.display())))?;
    let secret = text.trim_end_matches(['\n', '\r']).to_owned();
    if secret.is_empty() {
        return Err(ClusterError::Refused(format!("{} holds no secret", file.display())));
    }
    Ok(secret)
}

/// The PEM texts of [`TlsFiles`].
pub(crate) struct TlsPem {
    pub ca: Vec<u8>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Reads the files; a certificate needs its key and the reverse.
    pub(crate) fn read(&self) -> Result<TlsPem, ClusterError> {
        let read = |path: &PathBuf, what: &str| {
            std::fs::read(path)
                .map_err(|e| ClusterError::Refused(format!("reading the etcd {what} {}: {e}", path.display())))
        };
        let ca = read(&self.ca, "certificate authority")?;
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((read(cert, "client certificate")?, read(key, "client key")?)),
            (None, None) => None,
            _ => {
                return Err(ClusterError::Refused(
                    "a client certificate and its key go together (--etcd-cert and --etcd-key)".into(),
                ));
            }
        };
        Ok(TlsPem { ca, identity })
    }
}

#[cfg(test)]
mod tests {
    use super::{StoreConfig, TlsFiles};

    #[test]
    fn endpoints_take_the_etcd_scheme_and_lists() {
        assert_eq!(StoreConfig::plain("etcd://127.0.0.1:2379").urls().unwrap(), ["http://127.0.0.1:2379"]);
        assert_eq!(StoreConfig::plain("etcd://a:1,b:2").urls().unwrap(), ["http://a:1", "http://b:2"]);
        assert_eq!(StoreConfig::plain("a:1").urls().unwrap(), ["http://a:1"]);
        assert!(StoreConfig::plain("etcd://").urls().is_err());
        assert!(StoreConfig::plain("ftp://a:1").urls().is_err());
    }

    #[test]
    fn with_tls_every_endpoint_is_https_and_plaintext_is_refused() {
        let tls = StoreConfig { tls: Some(TlsFiles::default()), ..StoreConfig::plain("etcd://a:1,b:2") };
        assert_eq!(tls.urls().unwrap(), ["https://a:1", "https://b:2"]);
        let plain = StoreConfig { endpoints: "http://a:1".into(), ..tls.clone() };
        assert!(plain.urls().unwrap_err().to_string().contains("plaintext"));
        assert!(StoreConfig::plain("https://a:1").urls().unwrap_err().to_string().contains("--etcd-ca"));
    }

    #[test]
    fn a_password_is_never_sent_in_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let with_user = |endpoints: &str| StoreConfig {
            user: Some("baton".into()),
            password_file: Some(file.clone()),
            ..StoreConfig::plain(endpoints)
        };
        for endpoints in ["etcd://a:1", "http://a:1,b:2", "a:1"] {
            let refused = with_user(endpoints).check().expect_err(endpoints).to_string();
            assert!(refused.contains("plaintext") && refused.contains("--etcd-ca"), "{refused}");
        }
        let tls = StoreConfig { tls: Some(TlsFiles::default()), ..with_user("etcd://a:1") };
        assert!(tls.check_access().is_ok() && tls.credentials().is_ok());
        let allowed = StoreConfig { plaintext_password: true, ..with_user("etcd://a:1") };
        assert!(allowed.check().is_ok(), "the override lets it go");
        assert!(StoreConfig::plain("etcd://a:1").check().is_ok(), "no password, nothing to refuse");
    }

    #[test]
    fn credentials_need_a_user_and_a_password_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let config =
            StoreConfig { user: Some("baton".into()), password_file: Some(file.clone()), ..StoreConfig::default() };
        assert_eq!(config.credentials().unwrap(), Some(("baton".into(), "s3cret".into())));
        assert!(StoreConfig { user: None, ..config.clone() }.credentials().is_err());
        assert!(StoreConfig { password_file: None, ..config.clone() }.credentials().is_err());
        std::fs::write(&file, "\n").unwrap();
        assert!(config.credentials().is_err(), "an empty password is refused");
        assert_eq!(StoreConfig::default().credentials().unwrap(), None);
    }
}
