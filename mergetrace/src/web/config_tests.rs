use super::*;
use crate::testing::tls::{bcrypt_hash, TestPki};

/// The error of `text` (files relative to `dir`), as main prints it: one line.
fn error_of(text: &str, dir: &Path) -> String {
    let e = WebConfig::parse(text, dir).expect_err("the config should be refused");
    let line = crate::cli::error_line(&e);
    assert!(!line.contains('\n'), "not one line: {line}");
    line
}

fn tls_section(pki: &TestPki, extra: &str) -> String {
    format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: {}\n{extra}",
        pki.server_key.display()
    )
}

#[test]
fn an_empty_file_is_plain_http_without_auth() {
    for text in ["", "\n", "# nothing\n", "---\n"] {
        let c = WebConfig::parse(text, Path::new("/")).unwrap();
        assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
        assert!(!c.authenticates());
        assert_eq!(
            c.summary(),
            "plain HTTP (no tls_server_config), no basic auth"
        );
    }
}

#[test]
fn the_toolkit_example_with_client_certificates() {
    let pki = TestPki::new();
    let text = format!(
        "{}  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n  \
         min_version: TLS13\n\
         http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    \
         Strict-Transport-Security: max-age=31536000\n\
         basic_auth_users:\n  alice: {}\n  bob: '{}'\n",
        tls_section(&pki, ""),
        bcrypt_hash("alice's"),
        bcrypt_hash("bob's"),
    );
    let c = WebConfig::parse(&text, pki.path()).unwrap();
    let tls = c.tls.as_ref().unwrap();
    assert!(tls.verifies_clients() && c.authenticates());
    assert_eq!(tls.config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    assert!(
        tls.config.ignore_client_order,
        "the server's cipher order by default"
    );
    assert_eq!(
        c.summary(),
        "TLS 1.3, client certificates required and verified, basic auth (2 users)"
    );
    assert_eq!(c.users.len(), 2);
    assert_eq!(c.headers.len(), 2);
    // Relative names are the config directory's; every file read is watched.
    assert_eq!(
        c.files,
        vec![
            pki.server_cert.clone(),
            pki.server_key.clone(),
            pki.ca.clone()
        ]
    );
}

#[test]
fn tls_without_client_certificates_and_inline_pem() {
    let pki = TestPki::new();
    let c = WebConfig::parse(&tls_section(&pki, "  min_version: TLS10\n"), pki.path()).unwrap();
    // rustls has no TLS 1.0 or 1.1: a lower minimum is only made stronger.
    assert_eq!(
        c.summary(),
        "TLS 1.2–1.3, no client certificates, no basic auth"
    );
    assert!(!c.authenticates());
    let cert = std::fs::read_to_string(&pki.server_cert).unwrap();
    let key = std::fs::read_to_string(&pki.server_key).unwrap();
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let inline = format!(
        "tls_server_config:\n  cert: |\n{}  key: |\n{}  client_auth_type: RequireAnyClientCert\n",
        indent(&cert),
        indent(&key)
    );
    let c = WebConfig::parse(&inline, Path::new("/nonexistent")).unwrap();
    assert_eq!(
        c.summary(),
        "TLS 1.2–1.3, client certificates required, not verified, no basic auth"
    );
    assert!(c.files.is_empty());
}

#[test]
fn cipher_suites_curves_and_the_rate_limit() {
    let pki = TestPki::new();
    let text = tls_section(
        &pki,
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]\n  \
         curve_preferences: [X25519, CurveP256]\n  prefer_server_cipher_suites: false\n\
         rate_limit:\n  interval: 500ms\n  burst: 2\n",
    );
    let c = WebConfig::parse(&text, pki.path()).unwrap();
    let tls = c.tls.as_ref().unwrap();
    assert!(!tls.config.ignore_client_order);
    let suites: Vec<String> = (tls.config.crypto_provider().cipher_suites.iter())
        .map(|s| format!("{:?}", s.suite()))
        .collect();
    assert_eq!(suites[0], "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
    assert!(
        suites[1..].iter().all(|s| s.starts_with("TLS13_")),
        "{suites:?}"
    );
    assert_eq!(tls.config.crypto_provider().kx_groups.len(), 2);
    let limit = c.rate_limit.as_ref().unwrap();
    assert_eq!((limit.every, limit.burst), (Duration::from_millis(500), 2));
    // A burst of 2, then refused until a token comes back.
    assert!(limit.allow() && limit.allow() && !limit.allow());
    assert!(c
        .summary()
        .ends_with("at most 1 request per 500ms (burst 2)"));
    let off = WebConfig::parse("rate_limit:\n  interval: 0\n  burst: 5\n", pki.path()).unwrap();
    assert!(off.rate_limit.is_none());
}

#[test]
fn each_bad_file_is_one_line_naming_the_field() {
    let pki = TestPki::new();
    let dir = pki.path();
    let cases: Vec<(String, &str)> = vec![
        ("tls_server_config: [\n".into(), "line 1"),
        ("tls_server_config:\n  cert_fil: x\n".into(), "unknown field `cert_fil`"),
        ("basic_auth_users: 3\n".into(), "basic_auth_users"),
        (
            "tls_server_config:\n  cert_file: missing.crt\n  key_file: server.key\n".into(),
            "tls_server_config: cert_file",
        ),
        ("tls_server_config:\n  cert_file: server.crt\n".into(), "missing one of key or key_file"),
        ("tls_server_config:\n  key_file: server.key\n".into(), "missing one of cert or cert_file"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: client.key\n".into(),
            "server.crt and key_file",
        ),
        (
            "tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n".into(),
            "no PEM certificate",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.crt\n".into(),
            "no PEM private key",
        ),
        (tls_section(&pki, "  client_ca_file: ca.pem\n"), "client_auth_type is NoClientCert"),
        (
            tls_section(&pki, "  client_auth_type: RequireAndVerifyClientCert\n"),
            "name their CA in client_ca_file",
        ),
        (tls_section(&pki, "  client_auth_type: Always\n"), "client_auth_type \"Always\""),
        (
            tls_section(&pki, "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  client_allowed_sans: [a]\n"),
            "client_allowed_sans is not supported",
        ),
        (tls_section(&pki, "  max_version: TLS11\n"), "max_version TLS11 cannot be served"),
        (tls_section(&pki, "  min_version: SSL3\n"), "min_version \"SSL3\""),
        (
            tls_section(&pki, "  cipher_suites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n"),
            "TLS_RSA_WITH_AES_128_CBC_SHA is not a TLS 1.2 suite",
        ),
        (tls_section(&pki, "  curve_preferences: [CurveP521]\n"), "CurveP521 is not offered"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  cert: x\n  key_file: server.key\n".into(),
            "both cert and cert_file",
        ),
        ("basic_auth_users:\n  alice: secret\n".into(), "the password hash of \"alice\" is not a bcrypt hash"),
        (
            format!("basic_auth_users:\n  alice: {}\n", bcrypt_hash("x").replacen("$04$", "$99$", 1)),
            "cost 99",
        ),
        ("basic_auth_users:\n  'a:b': x\n".into(), "contains ':'"),
        ("http_server_config:\n  headers:\n    Server: me\n".into(), "\"Server\" cannot be set"),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n".into(),
            "X-Frame-Options must be one of",
        ),
        ("rate_limit:\n  interval: soon\n  burst: 1\n".into(), "rate_limit: interval \"soon\""),
        ("rate_limit:\n  interval: 1s\n".into(), "burst is 0"),
    ];
    for (text, want) in &cases {
        let line = error_of(text, dir);
        assert!(
            line.contains(want),
            "{text:?}: {line:?} does not say {want:?}"
        );
    }
    // A missing certificate names the file and the system's reason.
    let line = error_of(&cases[3].0, dir);
    assert!(
        line.contains(&dir.join("missing.crt").display().to_string()),
        "{line}"
    );
    assert!(line.contains("No such file or directory"), "{line}");
}

#[test]
fn load_names_the_file() {
    let pki = TestPki::new();
    let missing = pki.path().join("nope.yml");
    let e = crate::cli::error_line(&WebConfig::load(&missing).unwrap_err());
    assert!(
        e.starts_with(&format!("cannot read the web config {}", missing.display())),
        "{e}"
    );
    let bad = pki.path().join("bad.yml");
    std::fs::write(&bad, "basic_auth_users:\n  alice: plain\n").unwrap();
    let e = crate::cli::error_line(&WebConfig::load(&bad).unwrap_err());
    assert!(
        e.starts_with(&format!("web config {}: basic_auth_users", bad.display())),
        "{e}"
    );
    let good = pki.path().join("web.yml");
    std::fs::write(&good, tls_section(&pki, "")).unwrap();
    let c = WebConfig::load(&good).unwrap();
    assert_eq!(c.files[0], good, "the config itself is watched first");
}
