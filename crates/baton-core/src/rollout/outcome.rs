//! Business outcomes of a rollout's answers: a click, a conversion, an
//! order's value, posted by the client after the answer it followed.
//!
//! Every answer of a rollout in progress carries an outcome id. The id
//! describes itself: the side that answered, a sequence number, and a
//! message authentication code over both, HMAC-SHA256 under a key that
//! belongs to this rollout alone. So no table of issued ids is kept, and
//! an id cannot be made up, nor taken from one rollout to another:
//!
//! - The rollout's key is derived from the server's secret key
//!   ([`OutcomeKey`]: drawn from the OS at start, or read from a file all
//!   of a fleet's replicas share) and the rollout's identity
//!   ([`super::Rollout::id`]: random, or the fleet's rollout id). A later
//!   rollout of the same candidate has another identity, so another key:
//!   the earlier rollout's ids are unknown to it.
//! - The code is checked in constant time ([`hmac::Mac::verify_truncated_left`]).
//!   It is 64 bits: forging one id takes about 2^63 guesses.
//! - The id keeps the shape of earlier servers' ids (`o`, 8 hex digits,
//!   `s` or `c`, 24 hex digits), the code split around the side and the
//!   sequence, so that servers of both kinds read each other's ids as ids
//!   (unknown ones), never as malformed posts.
//!
//! What is kept is bounded: the last [`REMEMBERED`] ids accepted, so that
//! a client that posts a batch twice (a retry after a timeout) does not
//! count it twice.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::Role;
use super::assign::{mix, seed};
use crate::threads::sync::Lock;

type HmacSha256 = Hmac<Sha256>;

/// Accepted ids remembered to refuse a second posting of the same one.
pub const REMEMBERED: usize = 100_000;

/// Outcomes one post may carry.
pub const MAX_BATCH: usize = 10_000;

/// The largest value one outcome may carry: an order's value in cents up
/// to ten billion units. With at most [`MAX_BATCH`] per post, sums stay
/// exact far beyond any window; they saturate rather than become infinite
/// all the same ([`add_saturating`]).
pub const MAX_VALUE: f64 = 1e12;

/// Characters in an outcome id: `o`, 8 hex digits of the code, the side
/// (`s` or `c`), the sequence (16 hex digits), 8 more of the code.
pub const ID_LEN: usize = 1 + 8 + 1 + 16 + 8;

/// Bytes of the code an id carries.
const CODE_LEN: usize = 8;

/// What a rollout's key is derived with, beside the model and the
/// rollout's identity.
const CONTEXT: &[u8] = b"baton outcome ids v1\0";

/// The server's secret key for outcome ids. Its bytes never appear in a
/// log, an error or a status.
#[derive(Clone)]
pub struct OutcomeKey(Arc<[u8]>);

impl std::fmt::Debug for OutcomeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutcomeKey(..)")
    }
}

impl OutcomeKey {
    /// The key `secret` (a file's contents, shared by a fleet's replicas).
    pub fn new(secret: &[u8]) -> OutcomeKey {
        OutcomeKey(Arc::from(secret))
    }

    /// 32 bytes from the operating system's random source.
    pub fn random() -> Result<OutcomeKey, String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| format!("the operating system gave no random bytes: {e}"))?;
        Ok(OutcomeKey::new(&bytes))
    }

    /// The ids of the rollout of `model` whose identity is `rollout`.
    pub fn outcomes(&self, model: &str, rollout: u64) -> Outcomes {
        let mut derive = <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        derive.update(CONTEXT);
        derive.update(model.as_bytes());
        derive.update(&[0]);
        derive.update(&rollout.to_be_bytes());
        let key = derive.finalize().into_bytes();
        let mac = <HmacSha256 as Mac>::new_from_slice(&key).expect("HMAC takes a key of any length");
        Outcomes { mac, next: AtomicU64::new(random_u64()), seen: Lock::new(Seen::default()) }
    }
}

/// A random number for a rollout's identity and the start of its
/// sequence: from the operating system, or, should it give none, from the
/// clock and the process (they need to be unique, not secret).
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => mix(seed()),
    }
}

/// The ids of one rollout: issued on its answers, checked when outcomes
/// are posted. Shared by every routing table of the rollout, the watch
/// after promotion included.
pub struct Outcomes {
    /// Keyed with the rollout's key; cloned for each code.
    mac: HmacSha256,
    next: AtomicU64,
    seen: Lock<Seen>,
}

impl std::fmt::Debug for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcomes").finish_non_exhaustive()
    }
}

/// The accepted ids remembered, oldest first.
#[derive(Debug, Default)]
struct Seen {
    set: HashSet<(bool, u64)>,
    order: VecDeque<(bool, u64)>,
}

/// The fields of an id, before it is checked against a rollout.
struct Fields {
    candidate: bool,
    seq: u64,
    code: [u8; CODE_LEN],
}

impl Fields {
    /// Reads the fields of anything shaped like an outcome id.
    fn read(id: &str) -> Result<Fields, IdError> {
        let malformed = || {
            let shown: String = id.chars().take(48).collect();
            IdError::Malformed(format!(
                "'{shown}' is not an outcome id: one is {ID_LEN} characters, 'o', 8 hex digits, 's' or 'c', 24 hex \
                 digits, as baton_outcome_id gives it"
            ))
        };
        let bytes = id.as_bytes();
        if bytes.len() != ID_LEN || bytes[0] != b'o' || !id.is_ascii() {
            return Err(malformed());
        }
        // Hex digits only: `from_str_radix` would take a sign too.
        let hex = |range: std::ops::Range<usize>| {
            if !bytes[range.clone()].iter().all(u8::is_ascii_hexdigit) {
                return Err(malformed());
            }
            u64::from_str_radix(&id[range], 16).map_err(|_| malformed())
        };
        let (front, seq, back) = (hex(1..9)?, hex(10..26)?, hex(26..34)?);
        let candidate = match bytes[9] {
            b's' => false,
            b'c' => true,
            _ => return Err(malformed()),
        };
        let mut code = [0u8; CODE_LEN];
        code[..4].copy_from_slice(&(front as u32).to_be_bytes());
        code[4..].copy_from_slice(&(back as u32).to_be_bytes());
        Ok(Fields { candidate, seq, code })
    }
}

/// An id that parsed and belongs to this rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutcomeId {
    /// The side that answered.
    pub side: Role,
    seq: u64,
}

/// Why an id is not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdError {
    /// Not an outcome id at all: the client sent something else.
    Malformed(String),
    /// An outcome id, but not one of this rollout's: another rollout's (an
    /// ended one, say), one with a typo, or one made up; the code tells
    /// them from this rollout's.
    Foreign,
}

impl Outcomes {
    /// A new id for an answer of `side`; none for the previous version,
    /// which no rollout judges.
    pub fn issue(&self, side: Role) -> Option<String> {
        let candidate = match side {
            Role::Stable => false,
            Role::Candidate => true,
            Role::Previous => return None,
        };
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let code = self.code(candidate, seq).finalize().into_bytes();
        let word = |at: usize| u32::from_be_bytes([code[at], code[at + 1], code[at + 2], code[at + 3]]);
        let letter = if candidate { 'c' } else { 's' };
        Some(format!("o{:08x}{letter}{seq:016x}{:08x}", word(0), word(4)))
    }

    /// Reads an id this rollout issued.
    pub fn parse(&self, id: &str) -> Result<OutcomeId, IdError> {
        let Fields { candidate, seq, code } = Fields::read(id)?;
        self.code(candidate, seq).verify_truncated_left(&code).map_err(|_| IdError::Foreign)?;
        Ok(OutcomeId { side: if candidate { Role::Candidate } else { Role::Stable }, seq })
    }

    /// Takes each id not taken before, in order; returns which were new.
    /// The oldest remembered ids are forgotten beyond [`REMEMBERED`].
    pub fn claim(&self, ids: &[OutcomeId]) -> Vec<bool> {
        let mut seen = self.seen.lock();
        ids.iter()
            .map(|id| {
                let key = (id.side == Role::Candidate, id.seq);
                if !seen.set.insert(key) {
                    return false;
                }
                seen.order.push_back(key);
                if seen.order.len() > REMEMBERED
                    && let Some(oldest) = seen.order.pop_front()
                {
                    seen.set.remove(&oldest);
                }
                true
            })
            .collect()
    }

    /// The code of an id, before it is finalized.
    fn code(&self, candidate: bool, seq: u64) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(&[u8::from(candidate)]);
        mac.update(&seq.to_be_bytes());
        mac
    }
}

/// Whether one posted outcome can be counted at all: an id shaped like an
/// outcome id, and a value from 0 to [`MAX_VALUE`]. Says what is wrong,
/// for the post's answer.
pub fn check(id: &str, value: f64) -> Result<(), String> {
    if !(value.is_finite() && (0.0..=MAX_VALUE).contains(&value)) {
        return Err(format!("its value must be a finite number from 0 to {MAX_VALUE:e}, not {value}"));
    }
    match Fields::read(id) {
        Ok(_) => Ok(()),
        Err(IdError::Malformed(reason)) => Err(reason),
        Err(IdError::Foreign) => Ok(()),
    }
}

/// `a + b` for values at least 0, saturating at the largest finite number
/// rather than becoming infinite: a sum is written into a fleet's records
/// as JSON, where an infinity cannot be written.
pub fn add_saturating(a: f64, b: f64) -> f64 {
    let sum = a + b;
    if sum.is_finite() { sum } else { f64::MAX }
}

/// What became of a batch of posted outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Posted {
    /// Outcomes counted, each in its side's open window.
    pub accepted: u64,
    /// Outcomes for ids already posted: not counted again.
    pub duplicate: u64,
    /// Outcomes for ids of no rollout in progress (an ended one, an
    /// earlier rollout of the same candidate, another model's, one the
    /// code refuses): not counted.
    pub unknown: u64,
}

/// Why a batch of outcomes was refused whole.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PostError {
    /// An item is not an outcome: a malformed id, a value that is not a
    /// finite number from 0 to [`MAX_VALUE`], or one item too many.
    /// Nothing of the batch was counted.
    #[error("outcome {index}: {reason}; nothing of the batch was counted")]
    Malformed {
        /// The item's place in the batch, from 0.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The model is not served here.
    #[error("model '{0}' is not served here")]
    UnknownModel(String),
}

impl PostError {
    /// A stable name for responses and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            PostError::Malformed { .. } => "invalid_outcome",
            PostError::UnknownModel(_) => "model_not_found",
        }
    }
}

/// Checks a batch of `(id, value)` outcomes whole, then counts them in
/// `rollout`'s open window (none: there is no rollout, and every id is
/// unknown). Ids of other rollouts are not errors: a client posting late
/// after its rollout ended is expected.
pub fn post(rollout: Option<&super::Rollout>, posted: &[(&str, f64)]) -> Result<Posted, PostError> {
    let malformed = |index, reason| PostError::Malformed { index, reason };
    let mut ids = Vec::with_capacity(posted.len());
    let mut unknown = 0;
    if posted.len() > MAX_BATCH {
        return Err(malformed(MAX_BATCH, format!("a batch holds at most {MAX_BATCH} outcomes, not {}", posted.len())));
    }
    for (index, &(id, value)) in posted.iter().enumerate() {
        check(id, value).map_err(|reason| malformed(index, reason))?;
        // Without a rollout in progress, a well-formed id is nobody's.
        let parsed = match rollout {
            Some(rollout) => rollout.outcomes.parse(id),
            None => Err(IdError::Foreign),
        };
        match parsed {
            Ok(parsed) => ids.push((parsed, value)),
            Err(IdError::Foreign) => unknown += 1,
            Err(IdError::Malformed(reason)) => return Err(malformed(index, reason)),
        }
    }
    let mut result = Posted { unknown, ..Posted::default() };
    let Some(rollout) = rollout else { return Ok(result) };
    let fresh = rollout.outcomes.claim(&ids.iter().map(|(id, _)| *id).collect::<Vec<_>>());
    let mut sums = [(0u64, 0f64); 2];
    for ((id, value), new) in ids.iter().zip(fresh) {
        if !new {
            result.duplicate += 1;
            continue;
        }
        let slot = &mut sums[usize::from(id.side == Role::Candidate)];
        slot.0 += 1;
        slot.1 = add_saturating(slot.1, *value);
        result.accepted += 1;
    }
    for (side, (count, value)) in [Role::Stable, Role::Candidate].into_iter().zip(sums) {
        if count > 0 {
            rollout.observations.record_outcomes(side, count, value);
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> OutcomeKey {
        OutcomeKey::new(b"a test key of the server")
    }

    #[test]
    fn an_id_names_its_side_and_only_its_rollout_takes_it() {
        let (ours, theirs) = (key().outcomes("m", 7), key().outcomes("m", 8));
        let id = ours.issue(Role::Candidate).unwrap();
        assert_eq!(id.len(), ID_LEN);
        assert_eq!(ours.parse(&id).unwrap().side, Role::Candidate);
        assert_eq!(ours.parse(&ours.issue(Role::Stable).unwrap()).unwrap().side, Role::Stable);
        assert_eq!(theirs.parse(&id), Err(IdError::Foreign), "a later rollout of the same candidate");
        assert_eq!(key().outcomes("n", 7).parse(&id), Err(IdError::Foreign), "another model's rollout");
        assert_eq!(OutcomeKey::new(b"another server").outcomes("m", 7).parse(&id), Err(IdError::Foreign));
        assert!(ours.issue(Role::Previous).is_none());
        // A typo in the sequence, or the side changed: the code catches it.
        let mut typo = id.clone().into_bytes();
        typo[20] = if typo[20] == b'0' { b'1' } else { b'0' };
        assert_eq!(ours.parse(std::str::from_utf8(&typo).unwrap()), Err(IdError::Foreign));
        let mut side = id.clone().into_bytes();
        side[9] = b's';
        assert_eq!(ours.parse(std::str::from_utf8(&side).unwrap()), Err(IdError::Foreign));
        // The same rollout on another server with the same key takes it.
        assert!(key().outcomes("m", 7).parse(&id).is_ok());
    }

    /// The check digits of earlier servers: a hash keyed by the rollout's
    /// salt, which anyone can compute from the model and the candidate.
    fn public_check(salt: u64, candidate: bool, seq: u64) -> u32 {
        mix(salt ^ mix(seq ^ u64::from(candidate).rotate_right(1))) as u32
    }

    #[test]
    fn an_id_computed_from_public_facts_is_refused() {
        let ours = key().outcomes("m", 7);
        let salt = super::super::assign::salt("m", 2);
        let forged = format!("o{:08x}c{:016x}{:08x}", (salt >> 32) as u32, 42u64, public_check(salt, true, 42));
        assert_eq!(ours.parse(&forged), Err(IdError::Foreign));
        // Nor does flipping bits of a real id's code make another one.
        let real = ours.issue(Role::Candidate).unwrap();
        for at in [1, 8, 26, 33] {
            let mut bytes = real.clone().into_bytes();
            bytes[at] = if bytes[at] == b'f' { b'e' } else { b'f' };
            assert_eq!(ours.parse(std::str::from_utf8(&bytes).unwrap()), Err(IdError::Foreign), "{at}");
        }
    }

    #[test]
    fn what_is_not_an_id_is_malformed() {
        let o = key().outcomes("m", 1);
        let signed = format!("o+{}", &o.issue(Role::Stable).unwrap()[2..]);
        for bad in ["", "click", &"o".repeat(ID_LEN), &format!("x{}", &o.issue(Role::Stable).unwrap()[1..]), &signed] {
            assert!(matches!(o.parse(bad), Err(IdError::Malformed(_))), "{bad}");
        }
        let mut other_side = o.issue(Role::Stable).unwrap().into_bytes();
        other_side[9] = b'x';
        assert!(matches!(o.parse(std::str::from_utf8(&other_side).unwrap()), Err(IdError::Malformed(_))));
    }

    #[test]
    fn values_are_bounded_and_sums_never_become_infinite() {
        let id = key().outcomes("m", 1).issue(Role::Stable).unwrap();
        for bad in [f64::NAN, f64::INFINITY, -1.0, MAX_VALUE * 2.0, f64::MAX] {
            assert!(check(&id, bad).unwrap_err().contains("finite number from 0"), "{bad}");
        }
        assert!(check(&id, MAX_VALUE).is_ok() && check(&id, 0.0).is_ok());
        assert_eq!(add_saturating(f64::MAX, f64::MAX), f64::MAX);
        assert_eq!(add_saturating(1.5, 2.0), 3.5);
    }

    #[test]
    fn an_id_is_taken_once_and_memory_is_bounded() {
        let o = key().outcomes("m", 3);
        let a = o.parse(&o.issue(Role::Stable).unwrap()).unwrap();
        let b = o.parse(&o.issue(Role::Candidate).unwrap()).unwrap();
        assert_eq!(o.claim(&[a, b, a]), vec![true, true, false]);
        assert_eq!(o.claim(&[b]), vec![false]);
        let many: Vec<OutcomeId> = (0..REMEMBERED).map(|_| o.parse(&o.issue(Role::Stable).unwrap()).unwrap()).collect();
        assert!(o.claim(&many).iter().all(|&new| new));
        assert_eq!(o.seen.lock().order.len(), REMEMBERED);
        assert_eq!(o.claim(&[a]), vec![true], "the oldest id was forgotten to make room");
    }
}
