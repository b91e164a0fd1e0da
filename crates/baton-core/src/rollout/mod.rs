//! Safe rollouts inside one server: a model's stable version and at most
//! one candidate, in one of three modes, with guards that promote or roll
//! back by themselves.
//!
//! What a request needs to pick its version (the candidate, the mode, the
//! weight) lives in the routing table, in the one snapshot the request
//! takes ([`Rollout`] in [`crate::routing::ModelRoute`]); a change of
//! weight is one store. What the controller needs to decide (the plan, the
//! step reached, the decisions so far) lives beside it, in the registry
//! ([`control`]). What requests observe (latency, errors, the comparison of
//! outputs) goes into [`window::Observations`], shared by every table of
//! the rollout, which the controller reads one window at a time and judges
//! with [`guard::evaluate`].

pub mod assign;
pub mod compare;
pub mod guard;
pub mod plan;
pub mod window;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::version::Version;

/// How a candidate takes part in traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The candidate answers a share of requests that moves through steps;
    /// after the last step passes, it is promoted.
    Canary,
    /// The candidate answers a fixed share of requests until someone
    /// decides.
    Ab,
    /// The candidate gets a copy of a share of the stable traffic, off the
    /// response path; its answers are compared, never returned.
    Shadow,
}

impl Mode {
    /// The name used in configuration, responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Canary => "canary",
            Mode::Ab => "ab",
            Mode::Shadow => "shadow",
        }
    }

    /// Parses a name written by [`Mode::as_str`].
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "canary" => Some(Mode::Canary),
            "ab" => Some(Mode::Ab),
            "shadow" => Some(Mode::Shadow),
            _ => None,
        }
    }
}

/// The part a version plays for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The stable version.
    Stable,
    /// The candidate of a rollout.
    Candidate,
    /// A version kept for rollback, named by the request.
    Previous,
}

impl Role {
    /// The name used in responses and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Stable => "stable",
            Role::Candidate => "candidate",
            Role::Previous => "previous",
        }
    }
}

/// Weights are in basis points: 10 000 is all of the traffic.
pub const FULL: u32 = 10_000;

/// The rollout part of a model's route: what a request needs to pick its
/// version. Cheap to clone; a new weight is a new table with a clone of
/// this and another `weight`.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// The version being rolled out.
    pub candidate: Arc<Version>,
    /// How it takes part in traffic.
    pub mode: Mode,
    /// Its share, in basis points: of the answered requests in canary and
    /// A/B modes, of the stable requests copied to it in shadow mode.
    pub weight: u32,
    /// Whether requests the candidate answers are also run on the stable
    /// version, off the response path, to compare outputs (canary and A/B
    /// modes).
    pub paired: bool,
    /// What requests observe, shared by every table of this rollout.
    pub observations: Arc<window::Observations>,
}
