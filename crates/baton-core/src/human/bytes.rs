//! Byte counts as operators write them (`1048576`, `512KiB`, `64MiB`,
//! `2GiB`) and as messages show them.

use serde::{Deserialize, Deserializer};

/// Parses a byte count with an optional binary unit: `1048576`, `512KiB`,
/// `64MiB`, `2GiB`.
pub fn parse(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a byte count"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        other => return Err(format!("unknown unit '{other}'; use B, KiB, MiB or GiB")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("'{text}' is too large"))
}

/// A byte count for people: `900 B`, `12.5 MiB`, `2.00 GiB`.
pub fn show(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / GIB),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / MIB),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Deserializes an optional byte count written as an integer or as text
/// that [`parse`] reads.
pub fn deserialize_optional<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Bytes(u64),
        Text(String),
    }
    match Written::deserialize(deserializer)? {
        Written::Bytes(n) => Ok(Some(n)),
        Written::Text(text) => parse(&text).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_binary_and_mistakes_are_refused() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("512KiB"), Ok(512 << 10));
        assert_eq!(parse("64MiB"), Ok(64 << 20));
        assert_eq!(parse("2GiB"), Ok(2 << 30));
        assert!(parse("1MB").is_err());
        assert!(parse("x").is_err());
        assert!(parse("99999999999999999999GiB").is_err());
        assert_eq!(show(900), "900 B");
        assert_eq!(show(3 << 19), "1.5 MiB");
        assert_eq!(show(2 << 30), "2.00 GiB");
    }
}
