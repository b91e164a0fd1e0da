//! Business outcomes of a rollout's answers: a click, a conversion, an
//! order's value, posted by the client after the answer it followed.
//!
//! Every answer of a rollout in progress carries an outcome id. The id
//! describes itself: the rollout it belongs to (a tag of its salt), the
//! side that answered, a sequence number, and check digits over all three
//! keyed by the salt. So no table of issued ids is kept, any server of a
//! fleet running the same rollout accepts an id another one issued, and an
//! id with a typo or from another rollout is told apart from a real one.
//! The check digits are not a secret: posting outcomes takes the inference
//! scope, as asking for answers does.
//!
//! What is kept is bounded: the last [`REMEMBERED`] ids accepted, so that
//! a client that posts a batch twice (a retry after a timeout) does not
//! count it twice.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Role;
use super::assign::{mix, seed};
use crate::sync::Lock;

/// Accepted ids remembered to refuse a second posting of the same one.
pub const REMEMBERED: usize = 100_000;

/// Characters in an outcome id: `o`, the rollout's tag (8 hex digits), the
/// side (`s` or `c`), the sequence (16 hex digits), the check (8).
pub const ID_LEN: usize = 1 + 8 + 1 + 16 + 8;

/// The ids of one rollout: issued on its answers, checked when outcomes
/// are posted. Shared by every routing table of the rollout, the watch
/// after promotion included.
#[derive(Debug)]
pub struct Outcomes {
    salt: u64,
    next: AtomicU64,
    seen: Lock<Seen>,
}

/// The accepted ids remembered, oldest first.
#[derive(Debug, Default)]
struct Seen {
    set: HashSet<(bool, u64)>,
    order: VecDeque<(bool, u64)>,
}

/// The fields of an id, before it is checked against a rollout.
struct Fields {
    tag: u64,
    candidate: bool,
    seq: u64,
    check: u64,
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
        let hex = |range: std::ops::Range<usize>| u64::from_str_radix(&id[range], 16).map_err(|_| malformed());
        let (tag, seq, check) = (hex(1..9)?, hex(10..26)?, hex(26..34)?);
        let candidate = match bytes[9] {
            b's' => false,
            b'c' => true,
            _ => return Err(malformed()),
        };
        Ok(Fields { tag, candidate, seq, check })
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
    /// ended one, say), or one with a typo the check digits caught.
    Foreign,
}

impl Outcomes {
    /// The ids of the rollout salted with `salt`. The sequence starts at
    /// a random point, so that two servers of a fleet, or one server
    /// before and after a restart, do not issue the same id.
    pub fn new(salt: u64) -> Outcomes {
        Outcomes { salt, next: AtomicU64::new(mix(seed())), seen: Lock::new(Seen::default()) }
    }

    /// A new id for an answer of `side`; none for the previous version,
    /// which no rollout judges.
    pub fn issue(&self, side: Role) -> Option<String> {
        let candidate = match side {
            Role::Stable => false,
            Role::Candidate => true,
            Role::Previous => return None,
        };
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let letter = if candidate { 'c' } else { 's' };
        Some(format!("o{:08x}{letter}{seq:016x}{:08x}", self.tag(), self.check(candidate, seq)))
    }

    /// Reads an id this rollout issued.
    pub fn parse(&self, id: &str) -> Result<OutcomeId, IdError> {
        let Fields { tag, candidate, seq, check } = Fields::read(id)?;
        if tag != u64::from(self.tag()) || check != u64::from(self.check(candidate, seq)) {
            return Err(IdError::Foreign);
        }
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

    fn tag(&self) -> u32 {
        (self.salt >> 32) as u32
    }

    fn check(&self, candidate: bool, seq: u64) -> u32 {
        mix(self.salt ^ mix(seq ^ u64::from(candidate).rotate_right(1))) as u32
    }
}

/// What became of a batch of posted outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Posted {
    /// Outcomes counted, each in its side's open window.
    pub accepted: u64,
    /// Outcomes for ids already posted: not counted again.
    pub duplicate: u64,
    /// Outcomes for ids of no rollout in progress (an ended one, another
    /// model's, one the check digits refuse): not counted.
    pub unknown: u64,
}

/// Why a batch of outcomes was refused whole.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PostError {
    /// An item is not an outcome: a malformed id or a value that is not a
    /// finite number at least 0. Nothing of the batch was counted.
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
    for (index, &(id, value)) in posted.iter().enumerate() {
        if !(value.is_finite() && value >= 0.0) {
            return Err(malformed(index, format!("its value must be a finite number at least 0, not {value}")));
        }
        // Without a rollout in progress, a well-formed id is nobody's.
        let parsed = match rollout {
            Some(rollout) => rollout.outcomes.parse(id),
            None => Fields::read(id).and(Err(IdError::Foreign)),
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
        slot.1 += value;
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

    #[test]
    fn an_id_names_its_side_and_only_its_rollout_takes_it() {
        let (ours, theirs) = (Outcomes::new(7 << 40), Outcomes::new(8 << 40));
        let id = ours.issue(Role::Candidate).unwrap();
        assert_eq!(id.len(), ID_LEN);
        assert_eq!(ours.parse(&id).unwrap().side, Role::Candidate);
        assert_eq!(ours.parse(&ours.issue(Role::Stable).unwrap()).unwrap().side, Role::Stable);
        assert_eq!(theirs.parse(&id), Err(IdError::Foreign));
        assert!(ours.issue(Role::Previous).is_none());
        // A typo in the sequence, or the side changed: the check digits catch it.
        let mut typo = id.clone().into_bytes();
        typo[20] = if typo[20] == b'0' { b'1' } else { b'0' };
        assert_eq!(ours.parse(std::str::from_utf8(&typo).unwrap()), Err(IdError::Foreign));
        assert_eq!(ours.parse(&id.replacen('c', "s", 1)), Err(IdError::Foreign));
        // The same rollout on another server (the same salt) takes it.
        assert!(Outcomes::new(7 << 40).parse(&id).is_ok());
    }

    #[test]
    fn what_is_not_an_id_is_malformed() {
        let o = Outcomes::new(1);
        for bad in ["", "click", &"o".repeat(ID_LEN), &format!("x{}", &o.issue(Role::Stable).unwrap()[1..])] {
            assert!(matches!(o.parse(bad), Err(IdError::Malformed(_))), "{bad}");
        }
        let mut other_side = o.issue(Role::Stable).unwrap().into_bytes();
        other_side[9] = b'x';
        assert!(matches!(o.parse(std::str::from_utf8(&other_side).unwrap()), Err(IdError::Malformed(_))));
    }

    #[test]
    fn an_id_is_taken_once_and_memory_is_bounded() {
        let o = Outcomes::new(3);
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
