//! `tls_server_config` of the web configuration file: the server's certificate and key,
//! client certificates (`client_auth_type`, `client_ca_file`), protocol versions, cipher suites
//! and curves, as the Prometheus exporter-toolkit reads them, turned into a rustls server
//! configuration (the `ring` provider: TLS 1.2 and 1.3 with AEAD cipher suites only).
//!
//! Where the toolkit takes a Go name rustls has no counterpart for (TLS 1.0 or 1.1 as the
//! highest version, a CBC cipher suite, the P-521 curve, `client_allowed_sans`), the file is
//! refused in one line saying so: a restriction the file asks for is never silently dropped.
use std::{path::Path, path::PathBuf, sync::Arc};

use anyhow::{anyhow, bail, Context, Result};
use rustls::{
    client::danger::HandshakeSignatureValid,
    crypto::{ring, CryptoProvider, SupportedKxGroup, WebPkiSupportedAlgorithms},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, UnixTime},
    server::{
        danger::{ClientCertVerified, ClientCertVerifier},
        WebPkiClientVerifier,
    },
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    SupportedProtocolVersion,
};
use serde::Deserialize;

/// `tls_server_config` as written (the toolkit's field names). Empty strings count as unset,
/// as in the toolkit.
#[derive(Deserialize, Default, Debug)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of cert_file, key_file, client_ca_file, client_auth_type, … (the exporter-toolkit's fields)"
)]
pub struct TlsSpec {
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    client_ca: Option<String>,
    #[serde(default)]
    cert_file: Option<String>,
    #[serde(default)]
    key_file: Option<String>,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    client_ca_file: Option<String>,
    #[serde(default)]
    client_allowed_sans: Option<Vec<String>>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
    #[serde(default)]
    cipher_suites: Option<Vec<String>>,
    #[serde(default)]
    prefer_server_cipher_suites: Option<bool>,
    #[serde(default)]
    curve_preferences: Option<Vec<String>>,
}

/// What the server asks of a client's certificate (`client_auth_type`, Go's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    /// Asked for, not required, not verified.
    RequestClientCert,
    /// Required, not verified.
    RequireAnyClientCert,
    /// Verified against the client CA when one is sent.
    VerifyClientCertIfGiven,
    /// Required and verified against the client CA.
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(name: &str) -> Result<ClientAuth> {
        Ok(match name {
            "" | "NoClientCert" => ClientAuth::NoClientCert,
            "RequestClientCert" => ClientAuth::RequestClientCert,
            // The second name is the toolkit's older spelling, still accepted there.
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
            other => bail!(
                "client_auth_type {other:?} is not one of NoClientCert, RequestClientCert, \
                 RequireAnyClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
            ),
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }

    fn describe(self) -> &'static str {
        match self {
            ClientAuth::NoClientCert => "no client certificates",
            ClientAuth::RequestClientCert => "client certificates asked for, not verified",
            ClientAuth::RequireAnyClientCert => "client certificates required, not verified",
            ClientAuth::VerifyClientCertIfGiven => "client certificates verified when sent",
            ClientAuth::RequireAndVerifyClientCert => "client certificates required and verified",
        }
    }
}

/// A checked TLS configuration: the rustls server config every handshake uses.
#[derive(Debug)]
pub struct Tls {
    pub config: Arc<ServerConfig>,
    pub client_auth: ClientAuth,
    versions: (&'static str, &'static str),
}

impl Tls {
    /// `None` when the section names no certificate, key, CA or client auth (the toolkit's
    /// "TLS is disabled"); an error for anything it cannot serve. Every file read is added to
    /// `files`.
    pub fn from_spec(spec: TlsSpec, dir: &Path, files: &mut Vec<PathBuf>) -> Result<Option<Tls>> {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        let enabled = [
            &spec.cert,
            &spec.key,
            &spec.client_ca,
            &spec.cert_file,
            &spec.key_file,
            &spec.client_ca_file,
            &spec.client_auth_type,
        ]
        .into_iter()
        .any(set);
        if !enabled {
            return Ok(None);
        }
        if spec
            .client_allowed_sans
            .as_ref()
            .is_some_and(|s| !s.is_empty())
        {
            bail!(
                "client_allowed_sans is not supported by mergetrace: restrict clients with a \
                 client_ca_file of their own CA instead, or remove it"
            );
        }
        let mut read = |field: &str, file: &Option<String>, inline: &Option<String>| {
            pem_source(field, file, inline, dir, files)
        };
        let cert_pem = read("cert", &spec.cert_file, &spec.cert)?.ok_or_else(|| {
            anyhow!("missing one of cert or cert_file: name the server's certificate")
        })?;
        let key_pem = read("key", &spec.key_file, &spec.key)?.ok_or_else(|| {
            anyhow!("missing one of key or key_file: name the certificate's private key")
        })?;
        let ca_pem = read("client_ca", &spec.client_ca_file, &spec.client_ca)?;

        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem.1)
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow!("{}: not a PEM certificate ({e})", cert_pem.0))?;
        if certs.is_empty() {
            bail!("{}: no PEM certificate in it", cert_pem.0);
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem.1)
            .map_err(|e| anyhow!("{}: no PEM private key in it ({e})", key_pem.0))?;

        let client_auth = ClientAuth::parse(spec.client_auth_type.as_deref().unwrap_or(""))?;
        if ca_pem.is_some() && client_auth == ClientAuth::NoClientCert {
            bail!(
                "a client CA is given but client_auth_type is NoClientCert: set client_auth_type \
                 to RequireAndVerifyClientCert to check client certificates against it"
            );
        }
        let roots = match &ca_pem {
            Some((what, pem)) => Some(Arc::new(client_roots(what, pem)?)),
            None if client_auth.verifies() => bail!(
                "client_auth_type {client_auth:?} verifies client certificates: name their CA \
                 in client_ca_file"
            ),
            None => None,
        };

        let (versions, names) = protocol_versions(&spec.min_version, &spec.max_version)?;
        let provider = Arc::new(provider(&spec.cipher_suites, &spec.curve_preferences)?);
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| anyhow!("no cipher suite left for the TLS versions asked for: {e}"))?;
        let builder = match (client_auth, roots) {
            (ClientAuth::NoClientCert, _) => builder.with_no_client_auth(),
            (ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert, _) => builder
                .with_client_cert_verifier(Arc::new(AnyClientCert {
                    mandatory: client_auth == ClientAuth::RequireAnyClientCert,
                    algorithms: provider.signature_verification_algorithms,
                })),
            (_, Some(roots)) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
                let verifier = if client_auth == ClientAuth::VerifyClientCertIfGiven {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build().map_err(|e| {
                    anyhow!(
                        "client CA {}: {e}",
                        ca_pem.as_ref().map_or("", |c| c.0.as_str())
                    )
                })?)
            }
            (_, None) => unreachable!("a verifying client_auth_type without CA is refused above"),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .map_err(|e| anyhow!("{} and {}: {e}", cert_pem.0, key_pem.0))?;
        // Go's prefer_server_cipher_suites (default true): the server's order decides.
        config.ignore_client_order = spec.prefer_server_cipher_suites.unwrap_or(true);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Tls {
            config: Arc::new(config),
            client_auth,
            versions: names,
        }))
    }

    /// Whether only clients with a certificate the client CA signed get through.
    pub fn verifies_clients(&self) -> bool {
        self.client_auth == ClientAuth::RequireAndVerifyClientCert
    }

    pub fn summary(&self) -> String {
        let (lo, hi) = self.versions;
        let versions = if lo == hi {
            format!("TLS {lo}")
        } else {
            format!("TLS {lo}–{hi}")
        };
        format!("{versions}, {}", self.client_auth.describe())
    }
}

/// The PEM text of `field`: from `FIELD_file` (relative to `dir`) or inline, never both.
/// Returns (what to call it in a message, bytes).
fn pem_source(
    field: &str,
    file: &Option<String>,
    inline: &Option<String>,
    dir: &Path,
    files: &mut Vec<PathBuf>,
) -> Result<Option<(String, Vec<u8>)>> {
    let file = file.as_deref().filter(|s| !s.is_empty());
    let inline = inline.as_deref().filter(|s| !s.is_empty());
    match (file, inline) {
        (Some(_), Some(_)) => bail!("both {field} and {field}_file are given: keep one"),
        (Some(name), None) => {
            let path = dir.join(name);
            let bytes = std::fs::read(&path).with_context(|| {
                format!(
                    "{field}_file {}: cannot read it (fix the path, relative to the config file's \
                     directory, or the file's permissions)",
                    path.display()
                )
            })?;
            files.push(path.clone());
            Ok(Some((format!("{field}_file {}", path.display()), bytes)))
        }
        (None, Some(text)) => Ok(Some((format!("inline {field}"), text.as_bytes().to_vec()))),
        (None, None) => Ok(None),
    }
}

fn client_roots(what: &str, pem: &[u8]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| anyhow!("{what}: not a PEM certificate ({e})"))?;
        roots
            .add(cert)
            .map_err(|e| anyhow!("{what}: a certificate that cannot be a CA here ({e})"))?;
    }
    if roots.is_empty() {
        bail!("{what}: no PEM certificate in it");
    }
    Ok(roots)
}

/// min_version (default TLS12) and max_version (default TLS13), Go's names. rustls speaks 1.2
/// and 1.3 only: a lower minimum is raised to 1.2 (only stronger than asked), a lower maximum
/// cannot be served.
fn protocol_versions(
    min: &Option<String>,
    max: &Option<String>,
) -> Result<(
    Vec<&'static SupportedProtocolVersion>,
    (&'static str, &'static str),
)> {
    fn level(field: &str, v: &Option<String>, default: u8) -> Result<u8> {
        Ok(match v.as_deref().unwrap_or("") {
            "" => default,
            "TLS10" => 10,
            "TLS11" => 11,
            "TLS12" => 12,
            "TLS13" => 13,
            other => bail!("{field} {other:?} is not one of TLS10, TLS11, TLS12, TLS13"),
        })
    }
    let lo = level("min_version", min, 12)?.max(12);
    let hi = level("max_version", max, 13)?;
    if hi < 12 {
        bail!("max_version TLS{hi} cannot be served: mergetrace's TLS (rustls) speaks TLS12 and TLS13 only");
    }
    if lo > hi {
        bail!("min_version is above max_version");
    }
    let mut versions = Vec::new();
    if lo <= 12 {
        versions.push(&rustls::version::TLS12);
    }
    if hi >= 13 {
        versions.push(&rustls::version::TLS13);
    }
    let name = |v: u8| if v == 12 { "1.2" } else { "1.3" };
    Ok((versions, (name(lo), name(hi))))
}

/// ring's provider with the TLS 1.2 cipher suites and the curves the file lists, in its order
/// (Go's names; TLS 1.3 suites are not configurable in Go, and are all kept).
fn provider(suites: &Option<Vec<String>>, curves: &Option<Vec<String>>) -> Result<CryptoProvider> {
    // ring rather than aws-lc-rs: it builds with the C compiler alone (aws-lc wants cmake)
    // and links into the static glibc release. rustls marks it deprecated for its lack of
    // post-quantum key exchange, which Prometheus' Go client does not need.
    #[allow(deprecated)]
    let mut provider = ring::default_provider();
    if let Some(names) = suites.as_ref().filter(|n| !n.is_empty()) {
        let all = provider.cipher_suites.clone();
        let tls12 = |s: &rustls::SupportedCipherSuite| s.version() == &rustls::version::TLS12;
        let mut chosen: Vec<_> = Vec::new();
        for name in names {
            if let Some(s) = all
                .iter()
                .find(|s| tls12(s) && format!("{:?}", s.suite()) == *name)
            {
                chosen.push(*s);
            } else if !matches!(
                name.as_str(),
                "TLS_AES_128_GCM_SHA256"
                    | "TLS_AES_256_GCM_SHA384"
                    | "TLS_CHACHA20_POLY1305_SHA256"
            ) {
                let offered: Vec<String> = (all.iter().filter(|s| tls12(s)))
                    .map(|s| format!("{:?}", s.suite()))
                    .collect();
                bail!(
                    "cipher_suites: {name} is not a TLS 1.2 suite mergetrace offers (it offers {})",
                    offered.join(", ")
                );
            }
        }
        chosen.extend(all.iter().filter(|s| !tls12(s)).copied());
        provider.cipher_suites = chosen;
    }
    if let Some(names) = curves.as_ref().filter(|n| !n.is_empty()) {
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for name in names {
            groups.push(match name.as_str() {
                "X25519" => ring::kx_group::X25519,
                "CurveP256" => ring::kx_group::SECP256R1,
                "CurveP384" => ring::kx_group::SECP384R1,
                "CurveP521" => bail!(
                    "curve_preferences: CurveP521 is not offered by mergetrace's TLS: use X25519, \
                     CurveP256 or CurveP384"
                ),
                other => bail!(
                    "curve_preferences: {other:?} is not one of X25519, CurveP256, CurveP384, CurveP521"
                ),
            });
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

/// RequestClientCert and RequireAnyClientCert: a client's certificate is taken unverified (Go's
/// meaning of those names). Its handshake signature is still checked, so a client that sends a
/// certificate holds its key.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
