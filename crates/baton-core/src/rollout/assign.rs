//! Which side of a rollout a request falls on.
//!
//! A request's sticky key hashes into one of [`FULL`] buckets; the
//! candidate takes the buckets below its weight. As the weight rises, keys
//! only move from the stable version to the candidate, never back, and a
//! key's side changes only on promotion or rollback.
//!
//! The hash is salted with the rollout: the model and the candidate's
//! version ([`salt`]). Within one rollout a key keeps its bucket, across
//! restarts and on every replica of a fleet (the hash is fixed, it does not
//! change between builds); across rollouts the buckets are drawn afresh,
//! so the users who got the last 1 % canary are not the ones who get the
//! next one. A request without a key gets a random bucket, which puts it
//! on each side in the right proportion.

use std::cell::Cell;

use super::FULL;

/// FNV-1a's offset basis.
const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// The salt of a rollout of `model` to `candidate`.
pub fn salt(model: &str, candidate: u64) -> u64 {
    let mut hash = fnv(FNV_BASIS, model.as_bytes());
    hash = fnv(hash, &[0]);
    mix(fnv(hash, &candidate.to_le_bytes()))
}

/// The bucket of a sticky key in the rollout of `salt`: FNV-1a over the
/// key's bytes, from the salt, then a 64-bit finalizer so that keys
/// differing in one byte land far apart.
pub fn bucket(salt: u64, key: &[u8]) -> u32 {
    (mix(fnv(FNV_BASIS ^ salt, key)) % u64::from(FULL)) as u32
}

/// FNV-1a over `bytes`, from `hash`.
fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// A random bucket, for a request without a key: a per-thread xorshift
/// generator, seeded once per thread.
pub fn random_bucket() -> u32 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (mix(x) % u64::from(FULL)) as u32
    })
}

/// Whether a request in `bucket` goes to a candidate of `weight` basis
/// points.
pub fn to_candidate(bucket: u32, weight: u32) -> bool {
    bucket < weight
}

/// The splitmix64 finalizer.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A different nonzero seed per thread and per process.
pub(crate) fn seed() -> u64 {
    let local = 0u8;
    let address = std::ptr::addr_of!(local) as u64;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    mix(address ^ nanos.rotate_left(32) ^ u64::from(std::process::id())) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bucket(salt("ranker", 2), b"user-42")` as this hash computes it.
    const PINNED: u32 = 5_500;

    #[test]
    fn a_key_keeps_its_bucket_within_a_rollout() {
        let s = salt("ranker", 2);
        assert_eq!(bucket(s, b"user-42"), bucket(s, b"user-42"));
        // Fixed across builds and restarts: a changed hash would move users.
        assert_eq!(bucket(salt("ranker", 2), b"user-42"), PINNED);
        assert!(bucket(s, b"") < FULL);
    }

    #[test]
    fn another_rollout_draws_other_keys() {
        let (a, b, c) = (salt("ranker", 2), salt("ranker", 3), salt("other", 2));
        let first =
            |s: u64| -> Vec<u32> { (0..20_000).filter(|i| bucket(s, format!("u{i}").as_bytes()) < 100).collect() };
        let (in_a, in_b, in_c) = (first(a), first(b), first(c));
        let both = |x: &[u32], y: &[u32]| x.iter().filter(|k| y.contains(k)).count();
        assert!(in_a.len() > 150 && in_a.len() < 250, "{}", in_a.len());
        assert!(both(&in_a, &in_b) < 10 && both(&in_a, &in_c) < 10, "the same 1 % got two canaries");
    }

    #[test]
    fn keys_spread_evenly_over_buckets() {
        let n = 100_000u32;
        let s = salt("m", 7);
        let below = (0..n).filter(|i| to_candidate(bucket(s, format!("key-{i}").as_bytes()), 1000)).count();
        let share = below as f64 / f64::from(n);
        assert!((share - 0.10).abs() < 0.01, "share {share}");
    }

    #[test]
    fn random_buckets_spread_evenly() {
        let n = 100_000u32;
        let below = (0..n).filter(|_| to_candidate(random_bucket(), 2500)).count();
        let share = below as f64 / f64::from(n);
        assert!((share - 0.25).abs() < 0.01, "share {share}");
    }

    #[test]
    fn rising_weights_only_move_keys_to_the_candidate() {
        let weights = [100, 500, 2500, 5000, 10_000];
        for i in 0..10_000 {
            let b = bucket(salt("m", 2), format!("k{i}").as_bytes());
            let sides: Vec<bool> = weights.iter().map(|&w| to_candidate(b, w)).collect();
            assert!(sides.windows(2).all(|p| p[0] <= p[1]), "key k{i} moved back");
        }
    }
}
