//! A minimal HTTP/1.1 client over one keep-alive tokio `TcpStream`, made
//! for sending the same prepared request over and over: the request bytes
//! are written with one `write_all`, the answer is read into a buffer the
//! connection keeps, so a request allocates nothing on this path. Answers
//! framed by `Content-Length`, chunked, or by the connection closing are
//! all read.

use std::io;
use std::net::SocketAddr;

use httparse::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest answer read; beyond it the answer is an error.
const MAX_ANSWER: usize = 1 << 30;

/// What went wrong with an exchange.
#[derive(Debug)]
pub enum HttpError {
    /// The connection could not be opened.
    Connect(io::Error),
    /// Writing the request or reading the answer failed.
    Io(io::Error),
    /// The server closed the connection before the answer was complete.
    Closed {
        /// Bytes of the answer received before it closed.
        received: usize,
    },
    /// The answer is not HTTP/1.1 as expected.
    Malformed(String),
}

impl HttpError {
    /// A short stable name for grouping.
    pub fn kind(&self) -> &'static str {
        match self {
            HttpError::Connect(_) => "connect",
            HttpError::Io(_) => "io",
            HttpError::Closed { .. } => "closed",
            HttpError::Malformed(_) => "malformed",
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect(e) => write!(f, "connecting: {e}"),
            HttpError::Io(e) => write!(f, "{e}"),
            HttpError::Closed { received: 0 } => f.write_str("the server closed the connection without answering"),
            HttpError::Closed { received } => {
                write!(f, "the server closed the connection after {received} bytes of the answer")
            }
            HttpError::Malformed(m) => write!(f, "malformed answer: {m}"),
        }
    }
}

/// An answer; its body buffer is reused from one exchange to the next.
#[derive(Debug, Default)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// `Inference-Header-Content-Length`, when present.
    pub header_length: Option<usize>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// Whether the server will close the connection after this answer.
    pub close: bool,
    /// The role the answer names (`baton-role`), as a [`crate::role`] code.
    pub role: u8,
}

enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// One keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    filled: usize,
}

impl Conn {
    /// Opens a connection (Nagle off: requests are written whole).
    pub async fn connect(addr: SocketAddr) -> Result<Conn, HttpError> {
        let stream = TcpStream::connect(addr).await.map_err(HttpError::Connect)?;
        stream.set_nodelay(true).map_err(HttpError::Connect)?;
        Ok(Conn { stream, buf: vec![0; 16 << 10], filled: 0 })
    }

    /// Sends `request` (a complete HTTP/1.1 request) and reads the answer into `reply`.
    pub async fn exchange(&mut self, request: &[u8], reply: &mut Reply) -> Result<(), HttpError> {
        self.filled = 0;
        self.stream.write_all(request).await.map_err(HttpError::Io)?;
        self.read_reply(reply).await
    }

    async fn fill_more(&mut self) -> Result<usize, HttpError> {
        if self.filled == self.buf.len() {
            if self.buf.len() >= MAX_ANSWER {
                return Err(HttpError::Malformed(format!("the answer is larger than {MAX_ANSWER} bytes")));
            }
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.filled..]).await.map_err(HttpError::Io)?;
        self.filled += n;
        Ok(n)
    }

    async fn more(&mut self) -> Result<(), HttpError> {
        match self.fill_more().await? {
            0 => Err(HttpError::Closed { received: self.filled }),
            _ => Ok(()),
        }
    }

    async fn read_reply(&mut self, reply: &mut Reply) -> Result<(), HttpError> {
        let (head, framing) = loop {
            if let Some(parsed) = self.parse_head(reply)? {
                break parsed;
            }
            self.more().await?;
        };
        reply.body.clear();
        match framing {
            Framing::Length(length) => {
                while self.filled < head + length {
                    self.more().await?;
                }
                reply.body.extend_from_slice(&self.buf[head..head + length]);
            }
            Framing::Chunked => loop {
                if decode_chunked(&self.buf[head..self.filled], &mut reply.body)?.is_some() {
                    break;
                }
                self.more().await?;
            },
            Framing::UntilClose => {
                while self.fill_more().await? > 0 {}
                reply.body.extend_from_slice(&self.buf[head..self.filled]);
                reply.close = true;
            }
        }
        Ok(())
    }

    /// Parses the answer's head once it is complete: its length and how the
    /// body is framed. Informational (1xx) answers are skipped.
    fn parse_head(&mut self, reply: &mut Reply) -> Result<Option<(usize, Framing)>, HttpError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 48];
            let mut response = httparse::Response::new(&mut headers);
            let head = match response.parse(&self.buf[..self.filled]) {
                Ok(Status::Complete(n)) => n,
                Ok(Status::Partial) => return Ok(None),
                Err(e) => return Err(HttpError::Malformed(e.to_string())),
            };
            let status = response.code.unwrap_or_default();
            if (100..200).contains(&status) {
                self.buf.copy_within(head..self.filled, 0);
                self.filled -= head;
                continue;
            }
            reply.status = status;
            reply.header_length = None;
            reply.role = crate::role::NONE;
            reply.close = response.version == Some(0);
            let mut framing = Framing::UntilClose;
            for header in response.headers.iter() {
                let value = std::str::from_utf8(header.value).unwrap_or_default().trim();
                let name = header.name;
                if name.eq_ignore_ascii_case("content-length") {
                    let length = value.parse().map_err(|_| HttpError::Malformed(format!("Content-Length {value}")))?;
                    if !matches!(framing, Framing::Chunked) {
                        framing = Framing::Length(length);
                    }
                } else if name.eq_ignore_ascii_case("transfer-encoding") {
                    if value.to_ascii_lowercase().contains("chunked") {
                        framing = Framing::Chunked;
                    }
                } else if name.eq_ignore_ascii_case("connection") {
                    let value = value.to_ascii_lowercase();
                    reply.close = value.contains("close") || (reply.close && !value.contains("keep-alive"));
                } else if name.eq_ignore_ascii_case(crate::role::HEADER) {
                    reply.role = crate::role::parse(header.value);
                } else if name.eq_ignore_ascii_case("inference-header-content-length") {
                    reply.header_length = Some(
                        value
                            .parse()
                            .map_err(|_| HttpError::Malformed(format!("Inference-Header-Content-Length {value}")))?,
                    );
                }
            }
            return Ok(Some((head, framing)));
        }
    }
}

/// Decodes a chunked body into `out`: `Some(bytes used)` once the last
/// chunk and the trailers are in `data`, `None` when more data is needed.
pub fn decode_chunked(data: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, HttpError> {
    fn line(data: &[u8]) -> Option<usize> {
        data.windows(2).position(|w| w == b"\r\n")
    }
    out.clear();
    let mut pos = 0;
    loop {
        let Some(end) = line(&data[pos..]) else { return Ok(None) };
        let text = std::str::from_utf8(&data[pos..pos + end]).unwrap_or_default();
        let digits = text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(digits, 16)
            .map_err(|_| HttpError::Malformed(format!("chunk size '{}'", text.escape_debug())))?;
        pos += end + 2;
        if size == 0 {
            loop {
                let Some(end) = line(&data[pos..]) else { return Ok(None) };
                pos += end + 2;
                if end == 0 {
                    return Ok(Some(pos));
                }
            }
        }
        if data.len() < pos + size + 2 {
            return Ok(None);
        }
        if &data[pos + size..pos + size + 2] != b"\r\n" {
            return Err(HttpError::Malformed("a chunk is not followed by CRLF".into()));
        }
        out.extend_from_slice(&data[pos..pos + size]);
        pos += size + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies() {
        let mut out = Vec::new();
        let data = b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\nTrailer: 1\r\n\r\nrest";
        assert_eq!(decode_chunked(data, &mut out).unwrap(), Some(data.len() - 4));
        assert_eq!(out, b"Wikipedia");
        for cut in 0..data.len() - 4 {
            assert_eq!(decode_chunked(&data[..cut], &mut out).unwrap(), None, "cut at {cut}");
        }
        assert!(decode_chunked(b"zz\r\n", &mut out).is_err());
        assert!(decode_chunked(b"2\r\nabX\r\n", &mut out).is_err());
    }
}
