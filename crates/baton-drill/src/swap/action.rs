//! The ways a swap is made: the repository load API, publishing a version
//! directory into a watched repository, a shell command, or replacing
//! baton's binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::{Value, json};

use crate::args::{DrillArgs, SwapMethod};
use crate::caller::error_message;
use crate::rss::Followed;
use crate::target::Endpoint;

/// What a swap action did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the action succeeded (2xx, published, exit status 0).
    pub ok: bool,
    /// What went wrong, or what the action said.
    pub detail: String,
    /// The version the action brings, when it tells (publish: the new
    /// directory's number; load API: the `version` of baton's answer).
    pub version: Option<String>,
    /// An upgrade's handover, as the drill saw it.
    pub handover: Option<super::upgrade::Handover>,
}

/// A configured swap method.
pub enum Action {
    /// `POST /v2/repository/models/{m}/load`.
    LoadApi {
        /// The load URL.
        url: String,
        /// The admin token, sent as a bearer token.
        token: Option<String>,
        /// A client whose timeout is the swap timeout.
        agent: ureq::Agent,
    },
    /// Copy `template` into `model_dir/<next number>`, MANIFEST last.
    Publish {
        /// `<repo>/<model>`.
        model_dir: PathBuf,
        /// The version directory copied.
        template: PathBuf,
    },
    /// `POST /baton/v1/upgrade`, then the old process's exit.
    Upgrade(super::upgrade::Upgrade),
    /// `sh -c` of the command with its placeholders filled.
    Shell {
        /// The command, placeholders unfilled.
        command: String,
        /// The model, for `{model}`.
        model: String,
        /// The REST URL, for `{url}`.
        url: String,
        /// How long the command may run.
        timeout: Duration,
    },
}

impl Action {
    /// The action the options describe; checks the repository and template up front.
    /// `followed` are the processes whose memory the drill samples; an
    /// upgrade hands them on to the new process.
    pub fn from_args(args: &DrillArgs, http: &Endpoint, followed: &Followed) -> anyhow::Result<Action> {
        Ok(match args.swap {
            SwapMethod::LoadApi => Action::LoadApi {
                url: load_url(args, http),
                token: baton_protocol::token::client_token(args.token_file.as_deref())?,
                agent: admin_agent(args),
            },
            SwapMethod::Publish => {
                let repo = args.repo.as_ref().context("--swap publish needs --repo")?;
                let model_dir = repo.join(&args.model);
                ensure!(model_dir.is_dir(), "{} is not a directory", model_dir.display());
                let template = match &args.template {
                    Some(t) => t.clone(),
                    None => newest_version(&model_dir)?,
                };
                ensure!(template.is_dir(), "the template {} is not a directory", template.display());
                Action::Publish { model_dir, template }
            }
            SwapMethod::Rollout => bail!("--swap rollout is driven by the rollout driver, not as a swap action"),
            SwapMethod::Upgrade => Action::Upgrade(super::upgrade::Upgrade::from_args(args, http, followed)?),
            SwapMethod::Command => Action::Shell {
                command: args.command.clone().context("--swap command needs --command")?,
                model: args.model.clone(),
                url: http.base.clone(),
                timeout: args.swap_timeout,
            },
        })
    }

    /// Makes swap `index` (from 0), towards `version` when one is listed.
    pub fn run(&self, index: usize, version: Option<&str>) -> Outcome {
        match self {
            Action::LoadApi { url, token, agent } => load_api(agent, url, token.as_deref(), version),
            Action::Publish { model_dir, template } => match publish(model_dir, template) {
                Ok(number) => Outcome {
                    ok: true,
                    detail: format!("published {}", model_dir.join(number.to_string()).display()),
                    version: Some(number.to_string()),
                    handover: None,
                },
                Err(e) => Outcome { ok: false, detail: format!("{e:#}"), version: None, handover: None },
            },
            Action::Upgrade(upgrade) => upgrade.run(),
            Action::Shell { command, model, url, timeout } => {
                let line = command
                    .replace("{n}", &(index + 1).to_string())
                    .replace("{swap}", &(index + 1).to_string())
                    .replace("{version}", version.unwrap_or_default())
                    .replace("{model}", model)
                    .replace("{url}", url);
                super::shell::run(&line, *timeout)
            }
        }
    }
}

/// Where loads go: the admin listener when one is named, else the REST address.
fn load_url(args: &DrillArgs, http: &Endpoint) -> String {
    admin_url(args, http, &format!("/v2/repository/models/{}/load", args.model))
}

/// The HTTP client of management calls: answers of every status are read,
/// not raised, and each call is bounded by `--swap-timeout`.
pub fn admin_agent(args: &DrillArgs) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(args.swap_timeout)).build().into()
}

/// `path` on the admin listener when one is named, else on the REST address.
pub fn admin_url(args: &DrillArgs, http: &Endpoint, path: &str) -> String {
    match &args.admin_url {
        Some(admin) => format!("{}{path}", admin.trim_end_matches('/')),
        None => http.url(path),
    }
}

fn load_api(agent: &ureq::Agent, url: &str, token: Option<&str>, version: Option<&str>) -> Outcome {
    let body = match version {
        Some(v) => json!({ "parameters": { "version": v } }),
        None => json!({}),
    };
    let mut request = agent.post(url).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send(body.to_string());
    let mut response = match response {
        Ok(r) => r,
        Err(e) => return Outcome { ok: false, detail: format!("POST {url}: {e}"), version: None, handover: None },
    };
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    if !(200..300).contains(&status) {
        return Outcome {
            ok: false,
            detail: format!("HTTP {status}: {}", error_message(text.as_bytes())),
            version: None,
            handover: None,
        };
    }
    // baton answers with the load's report, which names the version.
    let learned = serde_json::from_str::<Value>(&text).ok().and_then(|v| match &v["version"] {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    });
    Outcome { ok: true, detail: format!("HTTP {status}"), version: learned, handover: None }
}

/// The version directories of a model directory, by number.
fn version_numbers(model_dir: &Path) -> anyhow::Result<Vec<(u64, PathBuf)>> {
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(model_dir).with_context(|| format!("reading {}", model_dir.display()))? {
        let entry = entry?;
        if let Some(n) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok())
            && entry.file_type()?.is_dir()
        {
            versions.push((n, entry.path()));
        }
    }
    versions.sort();
    Ok(versions)
}

/// The newest version directory with a complete MANIFEST.
pub fn newest_version(model_dir: &Path) -> anyhow::Result<PathBuf> {
    let versions = version_numbers(model_dir)?;
    match versions.into_iter().rev().find(|(_, dir)| baton_core::files::manifest::is_complete(dir)) {
        Some((_, dir)) => Ok(dir),
        None => bail!("{} has no complete version to use as the template; give --template", model_dir.display()),
    }
}

/// Copies `template` to the next version number and seals it, as `baton
/// package` does: every file first, the MANIFEST last. Returns the number.
pub fn publish(model_dir: &Path, template: &Path) -> anyhow::Result<u64> {
    let next = version_numbers(model_dir)?.last().map_or(1, |(n, _)| n + 1);
    let dest = model_dir.join(next.to_string());
    std::fs::create_dir(&dest).with_context(|| format!("creating {}", dest.display()))?;
    copy_tree(template, &dest, true)?;
    baton_core::files::manifest::write(&dest)
        .map_err(|e| anyhow::anyhow!("writing {}/MANIFEST: {e}", dest.display()))?;
    Ok(next)
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        if top && (name_text == baton_core::files::manifest::MANIFEST || name_text.starts_with(".MANIFEST")) {
            continue;
        }
        let (source, target) = (entry.path(), to.join(&name));
        if entry.file_type()?.is_dir() {
            std::fs::create_dir(&target).with_context(|| format!("creating {}", target.display()))?;
            copy_tree(&source, &target, false)?;
        } else {
            std::fs::copy(&source, &target).with_context(|| format!("copying {}", source.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_copies_and_seals() {
        let repo = tempfile::tempdir().unwrap();
        let model = repo.path().join("m");
        std::fs::create_dir_all(model.join("3/warmup")).unwrap();
        std::fs::write(model.join("3/model.onnx"), b"weights").unwrap();
        std::fs::write(model.join("3/warmup/a.json"), b"{}").unwrap();
        baton_core::files::manifest::write(&model.join("3")).unwrap();
        std::fs::create_dir_all(model.join("1")).unwrap();
        let template = newest_version(&model).unwrap();
        assert_eq!(template, model.join("3"));
        assert_eq!(publish(&model, &template).unwrap(), 4);
        assert!(baton_core::files::manifest::verify(&model.join("4")).is_ok());
        assert_eq!(std::fs::read(model.join("4/warmup/a.json")).unwrap(), b"{}");
        assert_eq!(publish(&model, &template).unwrap(), 5);
    }
}
