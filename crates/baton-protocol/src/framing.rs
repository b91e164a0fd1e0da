//! The body of a request or response: a JSON header, optionally followed by
//! binary tensor data whose start the `Inference-Header-Content-Length` HTTP
//! header gives. This module splits the two, parses the header, and hands
//! out the binary data tensor by tensor, checking that none is missing and
//! none is left over.

use serde::Deserialize;
use serde_json::Value;

use crate::error::CodecError;

/// Splits a body into its JSON header and the binary data after it.
pub(crate) fn split(body: &[u8], header_length: Option<usize>) -> Result<(&[u8], &[u8]), CodecError> {
    match header_length {
        None => Ok((body, &[])),
        Some(n) if n > body.len() => Err(CodecError::InvalidBinary(format!(
            "Inference-Header-Content-Length is {n} but the body has only {} bytes",
            body.len()
        ))),
        Some(n) => Ok(body.split_at(n)),
    }
}

/// Parses the JSON header; the error carries serde's line and column, and a
/// hint when binary data seems to follow a header whose length was not given.
pub(crate) fn parse_header<'a, T: Deserialize<'a>>(
    json: &'a [u8],
    header_length: Option<usize>,
) -> Result<T, CodecError> {
    serde_json::from_slice(json).map_err(|e| {
        let mut message = e.to_string();
        if header_length.is_none() && message.starts_with("trailing characters") {
            message.push_str(
                " (binary tensor data after the JSON needs the Inference-Header-Content-Length header to say where the JSON ends)",
            );
        }
        CodecError::InvalidJson(message)
    })
}

/// A JSON error met inside tensor data (the text at `offset` of the JSON
/// header, parsed on its own), with its line and column moved to where the
/// client can find them: in the header.
pub(crate) fn json_error_at(json: &[u8], offset: usize, error: &serde_json::Error) -> CodecError {
    let message = error.to_string();
    if error.line() == 0 {
        return CodecError::InvalidJson(message);
    }
    let position = format!(" at line {} column {}", error.line(), error.column());
    let what = message.strip_suffix(&position).unwrap_or(&message);
    let before = &json[..offset.min(json.len())];
    let lines_before = before.iter().filter(|&&b| b == b'\n').count();
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let (line, column) = if error.line() == 1 {
        (lines_before + 1, before.len() - line_start + error.column())
    } else {
        (lines_before + error.line(), error.column())
    };
    CodecError::InvalidJson(format!("{what} at line {line} column {column}"))
}

/// Shortens a JSON value for an error message.
pub(crate) fn brief(value: &Value) -> String {
    brief_text(value.to_string())
}

/// Shortens the text of a JSON value for an error message.
pub(crate) fn brief_text(text: String) -> String {
    const MAX: usize = 60;
    if text.len() <= MAX {
        return text;
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Hands out the binary data after the JSON header, in tensor order.
pub(crate) struct BinaryCursor<'a> {
    data: &'a [u8],
    used: usize,
    header_length: Option<usize>,
    role: &'static str,
    last: Option<String>,
}

impl<'a> BinaryCursor<'a> {
    /// A cursor over `data`, the bytes after a header of `header_length`
    /// bytes; `role` (`input` or `output`) names the tensors in messages.
    pub(crate) fn new(data: &'a [u8], header_length: Option<usize>, role: &'static str) -> BinaryCursor<'a> {
        BinaryCursor { data, used: 0, header_length, role, last: None }
    }

    /// The next `size` bytes, for the tensor `name`.
    pub(crate) fn take(&mut self, name: &str, size: usize) -> Result<&'a [u8], CodecError> {
        let remaining = self.data.len() - self.used;
        if size > remaining {
            let hint = if self.header_length.is_none() {
                " (no Inference-Header-Content-Length was given, so the body carries no binary data)"
            } else {
                ""
            };
            return Err(CodecError::InvalidBinary(format!(
                "{} '{name}': binary_data_size is {size} but only {remaining} bytes of binary data remain{hint}",
                self.role
            )));
        }
        let slice = &self.data[self.used..self.used + size];
        self.used += size;
        self.last = Some(name.to_owned());
        Ok(slice)
    }

    /// Checks that every byte of binary data belonged to a tensor.
    pub(crate) fn finish(self) -> Result<(), CodecError> {
        let left = self.data.len() - self.used;
        if left == 0 {
            return Ok(());
        }
        let role = self.role;
        Err(CodecError::InvalidBinary(match (&self.last, self.header_length) {
            (Some(last), _) => format!(
                "{left} bytes of binary data are left over after the last binary {role} '{last}': the {role}s' \
                 binary_data_size values add up to {} but {} bytes follow the JSON header",
                self.used,
                self.data.len()
            ),
            (None, header) => format!(
                "Inference-Header-Content-Length says the JSON header is {} bytes, which leaves {left} bytes of \
                 binary data, but no {role} has parameters.binary_data_size",
                header.unwrap_or(0)
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_checks_the_header_length() {
        assert_eq!(split(b"abc", None).unwrap(), (&b"abc"[..], &b""[..]));
        assert_eq!(split(b"abc", Some(1)).unwrap(), (&b"a"[..], &b"bc"[..]));
        let e = split(b"abc", Some(4)).unwrap_err();
        assert_eq!(e.to_string(), "Inference-Header-Content-Length is 4 but the body has only 3 bytes");
    }

    #[test]
    fn cursor_reports_missing_and_leftover_bytes() {
        let mut c = BinaryCursor::new(b"12345", Some(10), "input");
        assert_eq!(c.take("a", 2).unwrap(), b"12");
        let e = c.take("b", 4).unwrap_err().to_string();
        assert!(e.contains("input 'b': binary_data_size is 4 but only 3 bytes"), "{e}");
        let e = c.finish().unwrap_err().to_string();
        assert!(e.contains("3 bytes of binary data are left over after the last binary input 'a'"), "{e}");
        let e = BinaryCursor::new(b"xy", Some(7), "input").finish().unwrap_err().to_string();
        assert!(e.contains("JSON header is 7 bytes") && e.contains("no input has"), "{e}");
    }

    #[test]
    fn brief_cuts_long_values_on_char_boundaries() {
        let long = Value::String("é".repeat(100));
        let b = brief(&long);
        assert!(b.ends_with('…') && b.len() < 70, "{b}");
        assert_eq!(brief(&Value::from(5)), "5");
    }
}
