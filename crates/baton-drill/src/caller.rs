//! One worker's way of sending the drill's request and learning which
//! version answered, whatever the protocol: an enum over the HTTP client
//! and the gRPC one, each owning its own connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::grpc::GrpcCaller;
use super::http1::{Conn, HttpError, Reply};

/// A failed request: a kind for grouping and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// e.g. `connect`, `timeout`, `http 503`, `bad answer`.
    pub kind: String,
    /// What the client or the server said.
    pub message: String,
}

impl Failure {
    /// A failure of `kind`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure { kind: kind.into(), message: message.into() }
    }
}

/// Sends requests for one worker.
pub enum Caller {
    /// KServe V2 REST over a keep-alive HTTP/1.1 connection.
    Http(HttpCaller),
    /// KServe V2 gRPC over one HTTP/2 connection.
    Grpc(Box<GrpcCaller>),
}

impl Caller {
    /// Opens the connection ahead of the load; a failure here is left for
    /// the first request to report.
    pub async fn connect(&mut self) {
        match self {
            Caller::Http(http) => http.reconnect().await.ok(),
            Caller::Grpc(grpc) => grpc.connect().await.ok(),
        };
    }

    /// Sends one request; on success, the version that answered (empty
    /// when the server did not say) and the role it named ([`crate::role`]).
    pub async fn call(&mut self, timeout: Duration) -> Result<(&str, u8), Failure> {
        match self {
            Caller::Http(http) => http.call(timeout).await,
            Caller::Grpc(grpc) => grpc.call(timeout).await,
        }
    }
}

/// A connection idle this long is reopened before use: servers close idle
/// keep-alive connections after a few seconds (uvicorn, under MLServer and
/// KServe's server, after 5), and that is no failure of theirs.
const IDLE_REOPEN: Duration = Duration::from_secs(2);

/// The HTTP side: the prepared request and one connection.
pub struct HttpCaller {
    addr: SocketAddr,
    request: Arc<[u8]>,
    conn: Option<Conn>,
    last_used: Instant,
    reply: Reply,
    version: String,
}

impl HttpCaller {
    /// A caller sending `request` to `addr`.
    pub fn new(addr: SocketAddr, request: Arc<[u8]>) -> HttpCaller {
        HttpCaller {
            addr,
            request,
            conn: None,
            last_used: Instant::now(),
            reply: Reply::default(),
            version: String::new(),
        }
    }

    async fn reconnect(&mut self) -> Result<(), Failure> {
        self.conn = None;
        let conn = Conn::connect(self.addr).await.map_err(|e| Failure::new(e.kind(), e.to_string()))?;
        self.conn = Some(conn);
        self.last_used = Instant::now();
        Ok(())
    }

    async fn call(&mut self, timeout: Duration) -> Result<(&str, u8), Failure> {
        let deadline = tokio::time::Instant::now() + timeout;
        match tokio::time::timeout_at(deadline, self.exchange()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.conn = None;
                return Err(Failure::new(e.kind(), e.to_string()));
            }
            Err(_) => {
                self.conn = None;
                return Err(Failure::new("timeout", format!("no answer within {timeout:?}")));
            }
        }
        self.last_used = Instant::now();
        if self.reply.close {
            self.conn = None;
        }
        if self.reply.status != 200 {
            return Err(Failure::new(format!("http {}", self.reply.status), error_message(&self.reply.body)));
        }
        let answer = baton_protocol::decode_response(&self.reply.body, self.reply.header_length)
            .map_err(|e| Failure::new("bad answer", e.to_string()))?;
        self.version = answer.model_version;
        Ok((&self.version, self.reply.role))
    }

    async fn exchange(&mut self) -> Result<(), HttpError> {
        if self.conn.is_some() && self.last_used.elapsed() > IDLE_REOPEN {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some(Conn::connect(self.addr).await?);
        }
        let conn = self.conn.as_mut().expect("a connection was just opened");
        conn.exchange(&self.request, &mut self.reply).await
    }
}

/// The message of an error answer: its `error` field when it is KServe
/// JSON, else the start of the body.
pub fn error_message(body: &[u8]) -> String {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(error) = value.get("error").or_else(|| value.get("detail"))
    {
        return error.as_str().map_or_else(|| error.to_string(), str::to_owned);
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None if text.is_empty() => "(empty body)".to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages() {
        assert_eq!(error_message(br#"{"error":"model 'm' is not ready","kind":"x"}"#), "model 'm' is not ready");
        assert_eq!(error_message(br#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(error_message(b" oops \n"), "oops");
        assert!(error_message("é".repeat(300).as_bytes()).ends_with('…'));
    }
}
