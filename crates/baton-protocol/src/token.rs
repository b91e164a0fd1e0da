//! The bearer token that guards baton's management operations, as clients
//! and the server read it from a file: the file's content without
//! surrounding whitespace (so `echo secret > file` works), sent as
//! `Authorization: Bearer TOKEN`.

use std::path::{Path, PathBuf};

/// Why a token file gave no token. The token itself never appears in one.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file could not be read.
    #[error("reading the token file {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// It holds only whitespace.
    #[error("the token file {} is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// It holds characters an HTTP header cannot carry.
    #[error(
        "the token in {} holds characters an Authorization header cannot carry (use printable ASCII without spaces)",
        path.display()
    )]
    Unsendable {
        /// The file.
        path: PathBuf,
    },
}

/// Reads a token file: its content without surrounding whitespace. Empty,
/// unreadable or unsendable tokens are errors.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable { path: path.to_owned(), source })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenFileError::Empty { path: path.to_owned() });
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenFileError::Unsendable { path: path.to_owned() });
    }
    Ok(token.to_owned())
}

/// The token a client sends: the one in `file` when given, else the
/// `BATON_TOKEN` environment variable's, else none.
pub fn client_token(file: Option<&Path>) -> Result<Option<String>, TokenFileError> {
    if let Some(path) = file {
        return read_token_file(path).map(Some);
    }
    Ok(std::env::var("BATON_TOKEN").ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()))
}
