//! The TLS listener `serve` hands to axum when the web config has a `tls_server_config`: TCP
//! connections are accepted at once and their handshakes run in tasks of their own, so that a
//! client that never finishes one holds no one else up. Only finished handshakes reach the
//! HTTP server.
//!
//! Plain HTTP on this port is refused: a connection whose first byte cannot start a TLS
//! record gets Go's answer (400, "Client sent an HTTP request to an HTTPS server.") and is
//! closed, so it never reaches a handler.
use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
    sync::{mpsc, Semaphore},
};
use tokio_rustls::{server::TlsStream, TlsAcceptor};

use super::reload::Web;

/// How long a client may take from connecting to the end of its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; a connection beyond them is closed at once.
const MAX_HANDSHAKES: usize = 64;
/// A TLS record of the handshake starts with this byte (RFC 8446 §5.1, `handshake(22)`).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// What Go's net/http answers to plain HTTP on a TLS port, word for word.
const PLAIN_HTTP_ANSWER: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

pub struct TlsListener {
    tcp: TcpListener,
    web: Arc<Web>,
    done_tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    done_rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    handshakes: Arc<Semaphore>,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, web: Arc<Web>) -> TlsListener {
        let (done_tx, done_rx) = mpsc::channel(MAX_HANDSHAKES);
        TlsListener {
            tcp,
            web,
            done_tx,
            done_rx,
            handshakes: Arc::new(Semaphore::new(MAX_HANDSHAKES)),
        }
    }

    /// Starts the handshake of a new connection, with the TLS configuration in force now.
    fn start_handshake(&self, stream: TcpStream, addr: SocketAddr) {
        let Ok(permit) = self.handshakes.clone().try_acquire_owned() else {
            log::info!("{addr}: {MAX_HANDSHAKES} TLS handshakes already in progress: closed");
            return;
        };
        let Some(tls) = self.web.current().tls.as_ref().map(|t| t.config.clone()) else {
            // A reload cannot turn TLS off (see reload.rs): not reached.
            return;
        };
        let done = self.done_tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let handshake = async {
                if !starts_tls(&stream).await? {
                    answer_plain_http(stream).await?;
                    return Err(io::Error::other("plain HTTP on the TLS port: answered 400"));
                }
                TlsAcceptor::from(tls).accept(stream).await
            };
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Ok(Ok(tls)) => {
                    // The server stopped accepting (shutdown): the connection just closes.
                    let _ = done.send((tls, addr)).await;
                }
                Ok(Err(e)) => log::info!("{addr}: TLS handshake failed: {e}"),
                Err(_) => log::info!("{addr}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
            }
        });
    }
}

/// Whether the client's first byte starts a TLS handshake record (waits for that byte).
async fn starts_tls(stream: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    Ok(n == 1 && first[0] == TLS_HANDSHAKE_RECORD)
}

/// Answers 400 and closes. The request is read (what has come of it) before the close, so
/// that the client gets the answer rather than a reset for unread bytes.
async fn answer_plain_http(mut stream: TcpStream) -> io::Result<()> {
    use tokio::io::AsyncReadExt;
    stream.write_all(PLAIN_HTTP_ANSWER).await?;
    stream.shutdown().await?;
    let mut sink = [0u8; 4096];
    let drain = async {
        while stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    Ok(())
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                Some(done) = self.done_rx.recv() => return done,
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, addr)) => self.start_handshake(stream, addr),
                    // As axum's own TCP listener: a failed accept (out of file descriptors)
                    // is retried after a pause rather than ending the server.
                    Err(e) => {
                        log::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
