//! Certificates for tests of TLS to etcd, generated per test: a
//! certificate authority, a server certificate for the loopback address,
//! and client certificates, as PEM files in a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate authority and the files it signed.
pub struct Certs {
    dir: tempfile::TempDir,
    ca: Certificate,
    ca_key: KeyPair,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Pair {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

impl Certs {
    /// A new certificate authority, written as `ca.pem`.
    pub fn new() -> Certs {
        let dir = tempfile::tempdir().expect("a directory for certificates");
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, "baton test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = params.self_signed(&ca_key).expect("a self-signed CA");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("writing ca.pem");
        Certs { dir, ca, ca_key }
    }

    /// The certificate authority's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for 127.0.0.1 and localhost. It also serves as
    /// a client certificate: etcd's gateway dials etcd itself with it.
    pub fn server(&self) -> Pair {
        let usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.issue("server", vec!["127.0.0.1".into(), "localhost".into()], usages)
    }

    /// A client certificate whose common name is `name`.
    pub fn client(&self, name: &str) -> Pair {
        self.issue(name, Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn issue(&self, name: &str, names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>) -> Pair {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).expect("a signed certificate");
        let pair = Pair {
            cert: self.dir.path().join(format!("{name}.pem")),
            key: self.dir.path().join(format!("{name}-key.pem")),
        };
        std::fs::write(&pair.cert, cert.pem()).expect("writing a certificate");
        std::fs::write(&pair.key, key.serialize_pem()).expect("writing a key");
        pair
    }
}

impl Default for Certs {
    fn default() -> Self {
        Certs::new()
    }
}
