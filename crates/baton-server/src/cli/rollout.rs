//! `baton rollout`: starts a rollout, or shows, pauses, resumes, promotes
//! or aborts one.
//!
//! The first word is a verb or the model: `baton rollout ranker --version
//! 2` starts one (as does `baton rollout start ranker --version 2`, the
//! form for a model named like a verb), `baton rollout status ranker
//! [--watch]` shows it. Options that only a start takes are refused with
//! another verb, rather than ignored.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use super::{Target, render_rollout};

/// The verbs, in the order help lists them.
const VERBS: [&str; 6] = ["start", "status", "pause", "resume", "promote", "abort"];

/// How often `--watch` asks for the status.
const REFRESH: Duration = Duration::from_secs(1);

/// `baton rollout`'s arguments.
#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    /// The model to roll out, or a verb (start, status, pause, resume,
    /// promote, abort) followed by the model.
    #[arg(value_name = "MODEL|VERB")]
    pub first: String,
    /// The model, after a verb.
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,
    /// Start: the candidate version; the repository's newest when not given.
    #[arg(long)]
    pub version: Option<u64>,
    /// Start: canary, ab or shadow.
    #[arg(long)]
    pub mode: Option<String>,
    /// Start: the candidate's share at each step, in percent, e.g. 1,5,25,50,100.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub steps: Option<Vec<f64>>,
    /// Start: the length of a window, e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub interval: Option<Duration>,
    /// Start: failed windows that roll the candidate back.
    #[arg(long)]
    pub failure_limit: Option<u32>,
    /// Start: inconclusive windows in a row that pause the rollout.
    #[arg(long)]
    pub max_inconclusive: Option<u32>,
    /// Start: whether requests the candidate answers also run on the stable version, to compare outputs.
    #[arg(long, value_name = "true|false")]
    pub paired: Option<bool>,
    /// Start: how long after promotion the new stable version is still
    /// judged against the one it replaced, e.g. 5m; 0s for no watch.
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub watch_for: Option<Duration>,
    /// Start: the guards as a JSON object with the fields of [rollout.guards].
    #[arg(long, value_name = "JSON", conflicts_with_all = GUARD_FLAGS)]
    pub guards: Option<String>,
    #[command(flatten)]
    pub guard: GuardFlags,
    /// Pause: why.
    #[arg(long)]
    pub reason: Option<String>,
    /// Start and status: follow the rollout, refreshing every second, until it ends.
    #[arg(long)]
    pub watch: bool,
    /// Print the server's JSON answer instead of text.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// The guard flags' ids, which `--guards` excludes.
const GUARD_FLAGS: [&str; 8] = [
    "min_samples",
    "max_error_rate_increase",
    "max_p99_ratio",
    "max_abs_diff",
    "max_rel_l2",
    "min_cosine",
    "min_top1_agreement",
    "min_outcome_ratio",
];

/// Start: the guards one by one. Given any, they replace the model's
/// `[rollout.guards]` whole, the others taking baton's defaults.
#[derive(clap::Args, Debug, Default)]
pub struct GuardFlags {
    /// Start: requests each side needs in a window before it can pass or fail.
    #[arg(long)]
    pub min_samples: Option<u64>,
    /// Start: how much the candidate's error rate may exceed the stable version's.
    #[arg(long)]
    pub max_error_rate_increase: Option<f64>,
    /// Start: the candidate's p99 latency over the stable version's, at most.
    #[arg(long)]
    pub max_p99_ratio: Option<f64>,
    /// Start: the largest absolute difference of any output element.
    #[arg(long)]
    pub max_abs_diff: Option<f64>,
    /// Start: the mean relative L2 distance of an output.
    #[arg(long)]
    pub max_rel_l2: Option<f64>,
    /// Start: the mean cosine similarity of an output, at least.
    #[arg(long)]
    pub min_cosine: Option<f64>,
    /// Start: the share of rows with the same top class, at least.
    #[arg(long)]
    pub min_top1_agreement: Option<f64>,
    /// Start: the candidate's outcome value per answer over the stable version's, at least.
    #[arg(long)]
    pub min_outcome_ratio: Option<f64>,
}

impl GuardFlags {
    /// The flags given, as the JSON of `[rollout.guards]`; `None` when none was.
    pub(crate) fn json(&self) -> Option<Value> {
        let mut guards = Map::new();
        if let Some(n) = self.min_samples {
            guards.insert("min_samples".into(), json!(n));
        }
        let thresholds = [
            ("max_error_rate_increase", self.max_error_rate_increase),
            ("max_p99_ratio", self.max_p99_ratio),
            ("max_abs_diff", self.max_abs_diff),
            ("max_rel_l2", self.max_rel_l2),
            ("min_cosine", self.min_cosine),
            ("min_top1_agreement", self.min_top1_agreement),
            ("min_outcome_ratio", self.min_outcome_ratio),
        ];
        for (name, value) in thresholds {
            if let Some(value) = value {
                guards.insert(name.into(), json!(value));
            }
        }
        (!guards.is_empty()).then_some(Value::Object(guards))
    }
}

impl RolloutArgs {
    /// The verb and the model.
    fn command(&self) -> anyhow::Result<(&str, &str)> {
        match (VERBS.contains(&self.first.as_str()), self.model.as_deref()) {
            (true, Some(model)) => Ok((self.first.as_str(), model)),
            (true, None) => bail!("baton rollout {} needs a model: baton rollout {} MODEL", self.first, self.first),
            (false, None) => Ok(("start", self.first.as_str())),
            (false, Some(_)) => bail!(
                "'{}' is not one of {}; to start a rollout, name the model alone: baton rollout MODEL [--version N]",
                self.first,
                VERBS.join(", ")
            ),
        }
    }

    /// The body of a start: only what was given, so the model's section
    /// supplies the rest.
    fn start_body(&self) -> anyhow::Result<Value> {
        let mut body = Map::new();
        let mut put = |key: &str, value: Option<Value>| {
            if let Some(value) = value {
                body.insert(key.to_owned(), value);
            }
        };
        put("version", self.version.map(Value::from));
        put("mode", self.mode.clone().map(Value::from));
        put("steps", self.steps.clone().map(|s| json!(s)));
        put("interval_ms", self.interval.map(|d| json!(d.as_millis() as u64)));
        put("failure_limit", self.failure_limit.map(Value::from));
        put("max_inconclusive", self.max_inconclusive.map(Value::from));
        put("paired", self.paired.map(Value::from));
        put("watch_ms", self.watch_for.map(|d| json!(d.as_millis() as u64)));
        let guards = match &self.guards {
            Some(text) => Some(serde_json::from_str(text).context("--guards is not a JSON object")?),
            None => self.guard.json(),
        };
        put("guards", guards);
        Ok(Value::Object(body))
    }

    /// The start-only options given, by flag name.
    fn start_options(&self) -> Vec<&'static str> {
        let given = [
            ("--version", self.version.is_some()),
            ("--mode", self.mode.is_some()),
            ("--steps", self.steps.is_some()),
            ("--interval", self.interval.is_some()),
            ("--failure-limit", self.failure_limit.is_some()),
            ("--max-inconclusive", self.max_inconclusive.is_some()),
            ("--paired", self.paired.is_some()),
            ("--watch-for", self.watch_for.is_some()),
            ("--guards and the guard flags", self.guards.is_some() || self.guard.json().is_some()),
        ];
        given.into_iter().filter(|(_, given)| *given).map(|(flag, _)| flag).collect()
    }

    /// Refuses options the verb does not take.
    fn check(&self, verb: &str) -> anyhow::Result<()> {
        let start_only = self.start_options();
        if verb != "start" && !start_only.is_empty() {
            bail!(
                "{} can only be given when starting a rollout (baton rollout MODEL ...), not with {verb}",
                start_only.join(", ")
            );
        }
        if verb != "pause" && self.reason.is_some() {
            bail!("--reason goes with pause only");
        }
        if self.watch && !matches!(verb, "start" | "status") {
            bail!("--watch goes with a start or status only");
        }
        Ok(())
    }
}

/// `baton rollout ...`.
pub fn run(args: &RolloutArgs) -> anyhow::Result<()> {
    let (verb, model) = args.command()?;
    args.check(verb)?;
    let path = format!("/baton/v1/models/{model}/rollout");
    let answer = match verb {
        "status" => args.target.client()?.get_json(&path)?,
        "start" => args.target.admin()?.post_json(&path, &args.start_body()?)?,
        "pause" => {
            let body = args.reason.as_ref().map_or_else(|| json!({}), |reason| json!({ "reason": reason }));
            args.target.admin()?.post_json(&format!("{path}/pause"), &body)?
        }
        other => args.target.admin()?.post_json(&format!("{path}/{other}"), &json!({}))?,
    };
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    if !args.watch {
        print!("{}", render_rollout::view(&answer));
        return Ok(());
    }
    watch(args, &path, answer)
}

/// Shows the rollout every [`REFRESH`] until it ends. On a terminal each
/// view replaces the last; otherwise the views follow one another.
fn watch(args: &RolloutArgs, path: &str, mut answer: Value) -> anyhow::Result<()> {
    let client = args.target.client()?;
    let terminal = std::io::stdout().is_terminal();
    loop {
        let mut out = std::io::stdout().lock();
        if terminal {
            // Home the cursor and clear the screen.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        write!(out, "{}", render_rollout::view(&answer))?;
        if !terminal {
            writeln!(out)?;
        }
        out.flush()?;
        drop(out);
        if render_rollout::ended(&answer) {
            return Ok(());
        }
        std::thread::sleep(REFRESH);
        answer = client.get_json(path)?;
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RolloutArgs,
    }

    fn parse(line: &[&str]) -> RolloutArgs {
        Cli::try_parse_from(std::iter::once("rollout").chain(line.iter().copied())).unwrap().args
    }

    #[test]
    fn the_first_word_is_a_verb_or_the_model() {
        assert_eq!(parse(&["ranker", "--version", "2"]).command().unwrap(), ("start", "ranker"));
        assert_eq!(parse(&["status", "ranker"]).command().unwrap(), ("status", "ranker"));
        assert_eq!(parse(&["start", "status"]).command().unwrap(), ("start", "status"));
        assert!(parse(&["status"]).command().unwrap_err().to_string().contains("needs a model"));
        assert!(parse(&["ranker", "other"]).command().is_err());
    }

    #[test]
    fn a_start_sends_only_what_was_given() {
        let args = parse(&["m", "--version", "2", "--steps", "1,5,25", "--interval", "30s", "--max-rel-l2", "0.05"]);
        let body = args.start_body().unwrap();
        assert_eq!(
            body,
            json!({ "version": 2, "steps": [1.0, 5.0, 25.0], "interval_ms": 30000, "guards": { "max_rel_l2": 0.05 } })
        );
        let body = parse(&["m", "--interval", "500ms", "--paired", "false", "--mode", "shadow"]).start_body().unwrap();
        assert_eq!(body, json!({ "interval_ms": 500, "paired": false, "mode": "shadow" }));
        assert_eq!(parse(&["m", "--interval", "2m"]).start_body().unwrap()["interval_ms"], 120_000);
        assert_eq!(parse(&["m"]).start_body().unwrap(), json!({}));
        let guards = parse(&["m", "--guards", r#"{"min_cosine": 0.99}"#]).start_body().unwrap();
        assert_eq!(guards["guards"], json!({ "min_cosine": 0.99 }));
        assert!(Cli::try_parse_from(["rollout", "m", "--guards", "{}", "--max-rel-l2", "1"]).is_err());
        assert!(Cli::try_parse_from(["rollout", "m", "--interval", "soon"]).is_err());
    }

    #[test]
    fn options_go_with_their_verb() {
        assert!(parse(&["status", "m", "--version", "2"]).check("status").is_err());
        assert!(parse(&["abort", "m", "--reason", "x"]).check("abort").is_err());
        assert!(parse(&["pause", "m", "--reason", "x"]).check("pause").is_ok());
        assert!(parse(&["promote", "m", "--watch"]).check("promote").is_err());
        assert!(parse(&["status", "m", "--watch"]).check("status").is_ok());
    }
}
