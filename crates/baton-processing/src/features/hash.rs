//! The hash of categorical strings: MurmurHash3 x86_32 (Austin Appleby's
//! `MurmurHash3_x86_32`) over the value's bytes as sent, the hash
//! scikit-learn's `FeatureHasher`/`murmurhash3_32` and Spark's
//! `FeatureHasher` use, and Python's `mmh3.hash`. The bucket is the hash
//! read as unsigned, modulo the bucket count: in Python,
//! `mmh3.hash(value, seed, signed=False) % buckets`.

/// The name `features.toml` gives this hash (`hash_strings.hash`).
pub const MURMUR3_X86_32: &str = "murmur3_x86_32";

/// MurmurHash3 x86_32 of `bytes` with `seed`, unsigned.
pub fn murmur3_x86_32(bytes: &[u8], seed: u32) -> u32 {
    // Reading a slice cannot fail; the crate's reader-based API is why the
    // result is an io::Result at all.
    murmur3::murmur3_32(&mut std::io::Cursor::new(bytes), seed).unwrap_or_default()
}

/// The bucket of `bytes` among `buckets` (at least 1).
pub fn bucket(bytes: &[u8], seed: u32, buckets: u64) -> i64 {
    let bucket = u64::from(murmur3_x86_32(bytes, seed)) % buckets.max(1);
    // Below 2^32, so it fits.
    i64::try_from(bucket).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_vectors_of_murmur3_x86_32() {
        // Test vectors of the reference implementation (SMHasher), as
        // Python's mmh3 reproduces them.
        assert_eq!(murmur3_x86_32(b"", 0), 0);
        assert_eq!(murmur3_x86_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_x86_32(b"", 0xffff_ffff), 0x81f1_6f39);
        assert_eq!(murmur3_x86_32(b"\0\0\0\0", 0), 0x2362_f9de);
        assert_eq!(murmur3_x86_32(b"foo", 0), 4_138_058_784);
        assert_eq!(murmur3_x86_32(b"Hello, world!", 1234), 0xfaf6_cdb3);
    }

    #[test]
    fn buckets_are_the_unsigned_hash_modulo_the_count() {
        assert_eq!(bucket(b"foo", 0, 1000), 784);
        assert_eq!(bucket(b"foo", 0, 1), 0);
        assert_eq!(bucket(b"foo", 0, 1 << 32), 4_138_058_784);
    }
}
