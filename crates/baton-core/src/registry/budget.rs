//! The memory budget a load is admitted against.
//!
//! Two budgets may apply to a load: the server's, over the live versions of
//! every model, and the model's own (`[policy] memory_budget`), over that
//! model's. Before the load stage the candidate's memory is estimated; after
//! it (and again after warmup) it is measured; either time, what live
//! versions hold plus the candidate's must stay within each budget, or the
//! load is refused at stage `load` and the serving version is untouched.
//! A version in a worker process holds what it grew the server by plus the
//! worker's resident memory, read when the budget is checked.
//!
//! The estimate is the footprint of a version of the same model whose files
//! add up to the same size, when one was measured ([`crate::registry::memory`]), and
//! never less than the total size of the candidate's files: a lower bound
//! for a first load, which an engine's own structures, sessions and warmup
//! buffers come on top of. So the first load of a new size can pass the
//! estimate and still be refused once measured.

use thiserror::Error;

use crate::human::bytes::show;

/// Which budget refused a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The server's, over every model's live versions.
    Server,
    /// The model's own `[policy] memory_budget`.
    Model,
}

/// Where the candidate's figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// The largest measured for a version of the model with files of the
    /// same size.
    Footprint,
    /// The total size of its files: a lower bound.
    Files,
    /// Measured while it loaded (RSS growth so far).
    Measured,
    /// Measured while it loaded: RSS growth so far, plus the resident
    /// memory of the worker process it runs in.
    InWorker,
}

impl Basis {
    fn describe(self) -> &'static str {
        match self {
            Basis::Footprint => "estimated from a version of the same size measured earlier",
            Basis::Files => "estimated as the size of its files, a lower bound for a first load",
            Basis::Measured => "measured while it loaded",
            Basis::InWorker => "measured while it loaded, its worker process's resident memory included",
        }
    }
}

/// A load that live versions plus the candidate would take beyond a budget.
#[derive(Clone, Debug, Error)]
#[error(
    "memory budget exceeded: {scope} is {budget}; live versions{of} hold {in_use}, and version {version} would hold {candidate} ({basis}): {total} in all. {advice}",
    scope = self.scope_text(),
    budget = show(self.budget),
    of = self.of_text(),
    in_use = show(self.in_use),
    candidate = show(self.candidate),
    basis = self.basis.describe(),
    total = show(self.in_use.saturating_add(self.candidate)),
    advice = self.advice(),
)]
pub struct BudgetError {
    /// The model loading.
    pub model: String,
    /// The candidate version.
    pub version: u64,
    /// Which budget.
    pub scope: Scope,
    /// The budget, in bytes.
    pub budget: u64,
    /// Bytes live versions in the budget's scope hold, without the candidate.
    pub in_use: u64,
    /// Bytes the candidate holds or is estimated to hold.
    pub candidate: u64,
    /// Where `candidate` came from.
    pub basis: Basis,
}

impl BudgetError {
    fn scope_text(&self) -> String {
        match self.scope {
            Scope::Server => "the server's memory budget".to_owned(),
            Scope::Model => format!("the memory budget of model '{}' ([policy] memory_budget)", self.model),
        }
    }

    fn of_text(&self) -> String {
        match self.scope {
            Scope::Server => " of every model (and versions waiting to be freed)".to_owned(),
            Scope::Model => format!(" of '{}'", self.model),
        }
    }

    fn advice(&self) -> &'static str {
        "Free memory first (unload a model, retire a kept version, keep fewer with [policy] keep_previous), \
         raise the budget, or let the old version go before the new one loads ([policy] swap = \"resource\")"
    }
}

/// What a load is checked against: the budgets, and what live versions in
/// each one's scope hold now.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Check {
    /// The server's budget and what every live version holds.
    pub server: Option<(u64, u64)>,
    /// The model's budget and what its live versions hold.
    pub model: Option<(u64, u64)>,
}

impl Check {
    /// Refuses `candidate` bytes (from `basis`) of `model`'s `version` when
    /// they do not fit a budget; the model's budget is named first.
    pub fn admit(&self, model: &str, version: u64, candidate: u64, basis: Basis) -> Result<(), BudgetError> {
        let scopes = [(Scope::Model, self.model), (Scope::Server, self.server)];
        for (scope, limits) in scopes {
            let Some((budget, in_use)) = limits else { continue };
            if in_use.saturating_add(candidate) > budget {
                let model = model.to_owned();
                return Err(BudgetError { model, version, scope, budget, in_use, candidate, basis });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_candidate_fits_when_it_and_live_versions_stay_within_every_budget() {
        let check = Check { server: Some((100, 60)), model: Some((50, 20)) };
        assert!(check.admit("m", 2, 30, Basis::Files).is_ok(), "exactly at both budgets");
        let both = check.admit("m", 2, 41, Basis::Files).unwrap_err();
        assert_eq!((both.scope, both.in_use), (Scope::Model, 20), "the model's budget is named first");
        let check = Check { server: Some((100, 90)), model: None };
        let error = check.admit("m", 2, 11, Basis::Measured).unwrap_err();
        assert_eq!(error.scope, Scope::Server);
        let text = error.to_string();
        assert!(text.contains("100 B") && text.contains("90 B") && text.contains("11 B"), "{text}");
        assert!(text.contains("measured"), "{text}");
        assert!(Check { server: None, model: None }.admit("m", 1, u64::MAX, Basis::Files).is_ok());
    }
}
