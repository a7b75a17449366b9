//! The HTTP side end to end, in process: a real TLS listener and guard on loopback, a rustls
//! client with and without a client certificate, plain HTTP on the TLS port, basic auth, the
//! headers, the rate limit and reloads.
use std::{net::SocketAddr, path::Path, sync::Arc};

use axum::{routing::get, Router};
use base64::Engine;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::{auth, listener::TlsListener, Web};
use crate::testing::tls::{bcrypt_hash, TestPki};

/// A server of `/metrics` ("counts\n") behind the guard, with the web config `yaml` (written
/// to the PKI's directory, so relative names are its files).
async fn server(pki: &TestPki, yaml: &str) -> (SocketAddr, Arc<Web>) {
    let path = pki.path().join("web.yml");
    std::fs::write(&path, yaml).unwrap();
    let web = Arc::new(Web::load(&path).unwrap());
    let app = Router::new()
        .route("/metrics", get(|| async { "counts\n" }))
        .layer(axum::middleware::from_fn_with_state(
            auth::Guard::new(web.clone()),
            auth::guard,
        ));
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = TlsListener::new(tcp, web.clone());
    tokio::spawn(std::future::IntoFuture::into_future(axum::serve(
        listener, app,
    )));
    (addr, web)
}

fn client_config(pki: &TestPki, cert: Option<(&Path, &Path)>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&pki.ca).unwrap())
        .unwrap();
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match cert {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(cert).unwrap()],
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

/// GET /metrics over TLS: (status, head, body), or the error that ended the exchange.
async fn https_get(
    addr: SocketAddr,
    config: rustls::ClientConfig,
    credentials: Option<(&str, &str)>,
) -> Result<(u16, String, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let auth = credentials.map_or(String::new(), |(u, p)| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        format!("Authorization: Basic {b64}\r\n")
    });
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8(raw).map_err(|e| e.to_string())?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(format!("no head: {text:?}"))?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    Ok((
        status.ok_or(format!("no status: {head}"))?,
        head.to_string(),
        body.to_string(),
    ))
}

fn tls_yaml(extra: &str) -> String {
    format!("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n{extra}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_over_tls() {
    let pki = TestPki::new();
    let yaml = tls_yaml(&format!(
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
         basic_auth_users:\n  prometheus: {}\n",
        bcrypt_hash("scrape me")
    ));
    let (addr, _web) = server(&pki, &yaml).await;
    let get = |creds| https_get(addr, client_config(&pki, None), creds);
    for creds in [
        None,
        Some(("prometheus", "wrong")),
        Some(("nobody", "scrape me")),
    ] {
        let (status, head, body) = get(creds).await.unwrap();
        assert_eq!(status, 401, "{creds:?}: {head}");
        let head = head.to_ascii_lowercase();
        assert!(head.contains("www-authenticate: basic"), "{head}");
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert!(!body.contains("counts"), "{body}");
    }
    // Twice: the second answer comes from the verdict cache.
    for _ in 0..2 {
        let (status, head, body) = get(Some(("prometheus", "scrape me"))).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "counts\n"), "{head}");
        assert!(head
            .to_ascii_lowercase()
            .contains("x-content-type-options: nosniff"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_verified() {
    let pki = TestPki::new();
    let yaml =
        tls_yaml("  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n");
    let (addr, _web) = server(&pki, &yaml).await;
    let ours = client_config(&pki, Some((&pki.client_cert, &pki.client_key)));
    let (status, _, body) = https_get(addr, ours, None).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "counts\n"));
    for (what, config) in [
        ("no certificate", client_config(&pki, None)),
        (
            "a certificate of another CA",
            client_config(&pki, Some((&pki.stranger_cert, &pki.stranger_key))),
        ),
    ] {
        // TLS 1.3 ends the handshake on the client's side before the server has judged its
        // certificate: the refusal comes at the first read.
        let r = https_get(addr, config, None).await;
        assert!(r.is_err(), "{what}: served {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_tls_port_is_refused() {
    let pki = TestPki::new();
    let (addr, _web) = server(&pki, &tls_yaml("")).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    assert_eq!(
        raw,
        "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_takes_a_good_file_whole_and_keeps_the_old_one_for_a_bad_one() {
    let pki = TestPki::new();
    let users = |name: &str, password: &str| {
        tls_yaml(&format!(
            "basic_auth_users:\n  {name}: {}\n",
            bcrypt_hash(password)
        ))
    };
    let (addr, web) = server(&pki, &users("old", "old password")).await;
    let status = |creds: (&'static str, &'static str)| {
        let config = client_config(&pki, None);
        async move { https_get(addr, config, Some(creds)).await.unwrap().0 }
    };
    assert_eq!(status(("old", "old password")).await, 200);
    let path = pki.path().join("web.yml");
    assert!(!web.changed());

    std::fs::write(&path, users("new", "new password")).unwrap();
    assert!(web.changed());
    assert!(web.reload("test"));
    assert!(!web.changed());
    assert_eq!(status(("old", "old password")).await, 401);
    assert_eq!(status(("new", "new password")).await, 200);

    // A bad hash, a missing certificate, malformed YAML, TLS turned off: each keeps the
    // previous file in force.
    for bad in [
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  x: y\n".to_string(),
        "tls_server_config:\n  cert_file: gone.crt\n  key_file: server.key\n".to_string(),
        "tls_server_config: [\n".to_string(),
        format!("basic_auth_users:\n  new: {}\n", bcrypt_hash("new password")),
    ] {
        std::fs::write(&path, &bad).unwrap();
        assert!(!web.reload("test"), "{bad}");
        assert!(!web.changed(), "a failed reload is reported once");
        assert_eq!(status(("new", "new password")).await, 200, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_answers_429() {
    let pki = TestPki::new();
    let (addr, _web) = server(&pki, &tls_yaml("rate_limit:\n  interval: 1h\n  burst: 2\n")).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(
            https_get(addr, client_config(&pki, None), None)
                .await
                .unwrap()
                .0,
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
}
