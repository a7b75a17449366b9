//! A test PKI made at test time (no key is ever committed): a CA, a server certificate for
//! localhost and 127.0.0.1 it signed, a client certificate it signed, and a stranger's
//! client certificate it did not sign, written as PEM files into a scratch directory.
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

pub struct TestPki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf for `names`, signed by `issuer`: (certificate PEM, key PEM).
fn leaf(names: &[&str], issuer: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let params = CertificateParams::new(names).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl TestPki {
    pub fn new() -> TestPki {
        let dir = tempfile::Builder::new()
            .prefix("mt-test-pki-")
            .tempdir()
            .unwrap();
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca = ca("mergetrace test CA");
        let (server_cert, server_key) = leaf(&["localhost", "127.0.0.1"], &ca);
        let (client_cert, client_key) = leaf(&["prometheus"], &ca);
        let (stranger_cert, stranger_key) = leaf(&["prometheus"], &self::ca("another CA"));
        TestPki {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.crt", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.crt", &client_cert),
            client_key: write("client.key", &client_key),
            stranger_cert: write("stranger.crt", &stranger_cert),
            stranger_key: write("stranger.key", &stranger_key),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A bcrypt hash of `password` at the lowest cost (fast; the cost does not change what is
/// checked).
pub fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash_with_salt(password, 4, [42u8; 16])
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY)
}
