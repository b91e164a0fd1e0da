//! A version's files and their verification: `model.toml` ([`spec`], its
//! `[rollout]` section in [`rollout_spec`]), where a version comes from
//! ([`source`]), its `MANIFEST` and digests ([`manifest`], [`digest`]),
//! the check of every file against it ([`verified`], [`seal`]), verified
//! copies ([`copied`]), reads that a short answer cannot fool
//! ([`short_reads`]) and the scratch directories a load makes
//! ([`scratch`]). It imports the rooms below it: tensors (a spec's
//! signature), threads (a copy's serving-priority steps) and human (byte
//! counts).

pub mod copied;
pub mod digest;
pub mod manifest;
pub mod rollout_spec;
pub mod scratch;
pub mod seal;
pub mod short_reads;
pub mod source;
pub mod spec;
pub mod verified;
