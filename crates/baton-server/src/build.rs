//! Which build of baton this is: the package version, and a stamp that a
//! packager writes into the binary after it is built.
//!
//! The stamp is a fixed region of the binary that starts with
//! [`STAMP_MARKER`]; the bytes after the marker, up to the first zero, are
//! the stamp. A packager (or a test that needs a second, different binary)
//! rewrites those bytes in a copy of the binary, without building again.
//! `baton --version`, the server metadata (`GET /v2`, gRPC
//! `ServerMetadata`) and the status report the result, so an operator sees
//! which binary answers after `baton upgrade`.

/// The bytes the stamp region starts with.
pub const STAMP_MARKER: &[u8] = b"baton-build-stamp:";

/// The region: the marker, then room for a stamp of up to 46 bytes.
static STAMP: [u8; 64] =
    *b"baton-build-stamp:\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

/// The version this binary reports: the package version, then `+stamp`
/// when the binary carries a stamp.
pub fn version() -> String {
    // Read through black_box so that the compiler keeps the region and
    // reads it at run time rather than folding the zeros in.
    let region: &[u8; 64] = std::hint::black_box(&STAMP);
    let stamp = &region[STAMP_MARKER.len()..];
    let stamp = &stamp[..stamp.iter().position(|&b| b == 0).unwrap_or(stamp.len())];
    match std::str::from_utf8(stamp) {
        Ok(stamp) if !stamp.is_empty() => format!("{}+{stamp}", env!("CARGO_PKG_VERSION")),
        _ => env!("CARGO_PKG_VERSION").to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unstamped_binary_reports_the_package_version() {
        assert_eq!(STAMP.len(), 64);
        assert!(STAMP.starts_with(STAMP_MARKER));
        assert_eq!(version(), env!("CARGO_PKG_VERSION"));
    }
}
