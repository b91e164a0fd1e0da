//! `baton rollout`: starts a rollout, or shows, pauses, resumes, promotes
//! or aborts one, each a subcommand as in `baton fleet` and `kubectl argo
//! rollouts`: `baton rollout start ranker --version 2`, `baton rollout
//! status ranker [--follow]`, `baton rollout pause ranker --reason …`.
//! Each action takes only its own flags. The older form, the model alone,
//! still starts one: `baton rollout ranker --version 2`; its flags are
//! hidden from the help, which shows the subcommands.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use super::{Target, render_rollout};

/// How often `--follow` asks for the status.
const REFRESH: Duration = Duration::from_secs(1);

/// `baton rollout`'s arguments.
#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// The model to roll out: `baton rollout MODEL [options]` is `baton
    /// rollout start MODEL [options]`, the older form, still taken.
    #[arg(value_name = "MODEL", hide = true)]
    pub model: Option<String>,
    /// The older form's start options, hidden: `baton rollout start`
    /// shows them.
    #[command(flatten)]
    pub start: Hidden<StartOptions>,
    /// The older form's `--follow`.
    #[command(flatten)]
    pub follow: Hidden<Follow>,
    /// Print the server's JSON answer instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

/// What to do with a model's rollout.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Start a rollout of the candidate (the repository's newest by default).
    Start {
        /// The model.
        model: String,
        #[command(flatten)]
        options: Box<StartOptions>,
        #[command(flatten)]
        follow: Follow,
    },
    /// Show the rollout in progress, or the last one that ended (--follow follows it).
    Status {
        /// The model.
        model: String,
        #[command(flatten)]
        follow: Follow,
    },
    /// Stop judging windows; the candidate keeps its share.
    Pause {
        /// The model.
        model: String,
        /// Why, shown in the status.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Judge windows again.
    Resume {
        /// The model.
        model: String,
    },
    /// Make the candidate stable now.
    Promote {
        /// The model.
        model: String,
    },
    /// Take the candidate out; the stable version answers everything.
    Abort {
        /// The model.
        model: String,
    },
}

/// Start and status: whether to follow the rollout.
#[derive(clap::Args, Debug, Default, Clone, Copy)]
pub struct Follow {
    /// Follow the rollout, refreshing every second, until it ends.
    #[arg(long, short = 'f', alias = "watch", conflicts_with = "json")]
    pub follow: bool,
}

/// Flags taken but left out of the help: those of the older `baton
/// rollout MODEL` form.
#[derive(Debug, Default)]
pub struct Hidden<T>(pub T);

impl<T: clap::Args> clap::Args for Hidden<T> {
    fn augment_args(command: clap::Command) -> clap::Command {
        let flags = T::augment_args(clap::Command::new("hidden"));
        flags.get_arguments().fold(command, |command, arg| command.arg(arg.clone().hide(true)))
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl<T: clap::FromArgMatches> clap::FromArgMatches for Hidden<T> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Hidden)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

/// The options of a start.
#[derive(clap::Args, Debug, Default)]
pub struct StartOptions {
    /// The candidate version; the repository's newest when not given.
    #[arg(long)]
    pub version: Option<u64>,
    /// canary, ab or shadow.
    #[arg(long)]
    pub mode: Option<String>,
    /// The candidate's share at each step, in percent, e.g. 1,5,25,50,100.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub steps: Option<Vec<f64>>,
    /// The length of a window, e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub interval: Option<Duration>,
    /// Failed windows that roll the candidate back.
    #[arg(long)]
    pub failure_limit: Option<u32>,
    /// Inconclusive windows in a row that pause the rollout.
    #[arg(long)]
    pub max_inconclusive: Option<u32>,
    /// Whether requests the candidate answers also run on the stable version, to compare outputs.
    #[arg(long, value_name = "true|false")]
    pub paired: Option<bool>,
    /// How long after promotion the new stable version is still judged
    /// against the one it replaced, e.g. 5m; 0s for no watch.
    #[arg(long, value_parser = baton_drill::args::parse_duration)]
    pub watch_for: Option<Duration>,
    /// The guards as a JSON object with the fields of [rollout.guards].
    #[arg(long, value_name = "JSON", conflicts_with_all = GUARD_FLAGS)]
    pub guards: Option<String>,
    #[command(flatten)]
    pub guard: GuardFlags,
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
    /// requests each side needs in a window before it can pass or fail.
    #[arg(long)]
    pub min_samples: Option<u64>,
    /// how much the candidate's error rate may exceed the stable version's.
    #[arg(long)]
    pub max_error_rate_increase: Option<f64>,
    /// the candidate's p99 latency over the stable version's, at most.
    #[arg(long)]
    pub max_p99_ratio: Option<f64>,
    /// the largest absolute difference of any output element.
    #[arg(long)]
    pub max_abs_diff: Option<f64>,
    /// the mean relative L2 distance of an output.
    #[arg(long)]
    pub max_rel_l2: Option<f64>,
    /// the mean cosine similarity of an output, at least.
    #[arg(long)]
    pub min_cosine: Option<f64>,
    /// the share of rows with the same top class, at least.
    #[arg(long)]
    pub min_top1_agreement: Option<f64>,
    /// the candidate's outcome value per answer over the stable version's, at least.
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

impl StartOptions {
    /// The body of a start: only what was given, so the model's section
    /// supplies the rest.
    fn body(&self) -> anyhow::Result<Value> {
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

    /// Whether any option was given.
    fn any(&self) -> bool {
        self.body().map_or(true, |b| b.as_object().is_some_and(|o| !o.is_empty())) || self.guards.is_some()
    }
}

impl RolloutArgs {
    /// The verb, the model, and the start's options.
    fn command(&self) -> anyhow::Result<(&'static str, &str, Option<&StartOptions>)> {
        let given_before = self.model.is_some() || self.start.0.any() || self.follow.0.follow;
        let (verb, model) = match &self.action {
            None => match &self.model {
                Some(model) => return Ok(("start", model, Some(&self.start.0))),
                None => bail!(
                    "name a model to start a rollout (baton rollout start MODEL), or an action: \
                     baton rollout status|pause|resume|promote|abort MODEL"
                ),
            },
            Some(_) if given_before => {
                bail!("give the model and the start's options after the action: baton rollout start MODEL --version N")
            }
            Some(Action::Start { model, options, .. }) => return Ok(("start", model, Some(options))),
            Some(Action::Status { model, .. }) => ("status", model),
            Some(Action::Pause { model, .. }) => ("pause", model),
            Some(Action::Resume { model }) => ("resume", model),
            Some(Action::Promote { model }) => ("promote", model),
            Some(Action::Abort { model }) => ("abort", model),
        };
        Ok((verb, model, None))
    }

    /// Whether to follow the rollout (`--follow`, given to a start or a status).
    fn follows(&self) -> bool {
        match &self.action {
            None => self.follow.0.follow,
            Some(Action::Start { follow, .. } | Action::Status { follow, .. }) => follow.follow,
            Some(_) => false,
        }
    }
}

/// `baton rollout ...`.
pub fn run(args: &RolloutArgs) -> anyhow::Result<()> {
    let (verb, model, start) = args.command()?;
    let path = format!("/baton/v1/models/{model}/rollout");
    let answer = match (verb, start, &args.action) {
        (_, Some(options), _) => args.target.admin()?.post_json(&path, &options.body()?)?,
        ("status", ..) => args.target.client()?.get_json(&path)?,
        (_, _, Some(Action::Pause { reason, .. })) => {
            let body = reason.as_ref().map_or_else(|| json!({}), |reason| json!({ "reason": reason }));
            args.target.admin()?.post_json(&format!("{path}/pause"), &body)?
        }
        (other, ..) => args.target.admin()?.post_json(&format!("{path}/{other}"), &json!({}))?,
    };
    if args.json {
        println!("{answer}");
        return Ok(());
    }
    if !args.follows() {
        print!("{}", render_rollout::view(&answer));
        return Ok(());
    }
    follow(args, &path, answer)
}

/// Shows the rollout every [`REFRESH`] until it ends. On a terminal each
/// view replaces the last; otherwise the views follow one another.
fn follow(args: &RolloutArgs, path: &str, mut answer: Value) -> anyhow::Result<()> {
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

    fn verb_and_model(line: &[&str]) -> anyhow::Result<(&'static str, String)> {
        let args = parse(line);
        args.command().map(|(verb, model, _)| (verb, model.to_owned()))
    }

    #[test]
    fn actions_are_subcommands_and_the_model_alone_starts() {
        assert_eq!(verb_and_model(&["ranker", "--version", "2"]).unwrap(), ("start", "ranker".into()));
        assert_eq!(verb_and_model(&["start", "ranker", "--version", "2"]).unwrap(), ("start", "ranker".into()));
        assert_eq!(verb_and_model(&["status", "ranker"]).unwrap(), ("status", "ranker".into()));
        assert_eq!(verb_and_model(&["start", "status"]).unwrap(), ("start", "status".into()));
        assert_eq!(verb_and_model(&["abort", "m", "--url", "http://x"]).unwrap(), ("abort", "m".into()));
        assert_eq!(parse(&["--url", "http://x", "status", "m"]).target.url, "http://x");
        assert_eq!(parse(&["status", "m", "--url", "http://x"]).target.url, "http://x");
        assert!(Cli::try_parse_from(["rollout", "status"]).is_err(), "status needs a model");
        assert!(Cli::try_parse_from(["rollout", "ranker", "other"]).is_err());
        assert!(verb_and_model(&[]).unwrap_err().to_string().contains("baton rollout start MODEL"));
    }

    #[test]
    fn a_start_sends_only_what_was_given() {
        let body = |line: &[&str]| parse(line).command().unwrap().2.unwrap().body().unwrap();
        assert_eq!(
            body(&["m", "--version", "2", "--steps", "1,5,25", "--interval", "30s", "--max-rel-l2", "0.05"]),
            json!({ "version": 2, "steps": [1.0, 5.0, 25.0], "interval_ms": 30000, "guards": { "max_rel_l2": 0.05 } })
        );
        assert_eq!(
            body(&["start", "m", "--interval", "500ms", "--paired", "false", "--mode", "shadow"]),
            json!({ "interval_ms": 500, "paired": false, "mode": "shadow" })
        );
        assert_eq!(body(&["m", "--interval", "2m"])["interval_ms"], 120_000);
        assert_eq!(body(&["m"]), json!({}));
        assert_eq!(body(&["m", "--guards", r#"{"min_cosine": 0.99}"#])["guards"], json!({ "min_cosine": 0.99 }));
        assert!(Cli::try_parse_from(["rollout", "m", "--guards", "{}", "--max-rel-l2", "1"]).is_err());
        assert!(Cli::try_parse_from(["rollout", "m", "--interval", "soon"]).is_err());
    }

    #[test]
    fn options_go_with_their_action() {
        assert!(Cli::try_parse_from(["rollout", "status", "m", "--version", "2"]).is_err());
        assert!(Cli::try_parse_from(["rollout", "abort", "m", "--reason", "x"]).is_err());
        assert!(parse(&["pause", "m", "--reason", "x"]).command().is_ok());
        for action in ["pause", "resume", "promote", "abort"] {
            assert!(Cli::try_parse_from(["rollout", action, "m", "--follow"]).is_err(), "{action} --follow");
            assert!(Cli::try_parse_from(["rollout", action, "m", "--watch"]).is_err(), "{action} --watch");
            assert!(Cli::try_parse_from(["rollout", action, "m", "--version", "2"]).is_err(), "{action} --version");
            assert!(parse(&[action, "m", "--json"]).command().is_ok(), "{action} --json");
        }
        for action in ["resume", "promote", "start", "status"] {
            assert!(Cli::try_parse_from(["rollout", action, "m", "--reason", "x"]).is_err(), "{action} --reason");
        }
        assert!(Cli::try_parse_from(["rollout", "status", "m", "--follow", "--json"]).is_err());
        assert!(parse(&["status", "m", "--follow"]).follows());
        assert!(parse(&["status", "m", "-f"]).follows());
        assert!(parse(&["start", "m", "--follow"]).follows());
        assert!(parse(&["m", "--follow"]).follows());
        assert!(!parse(&["status", "m"]).follows());
        // The older spelling of --follow is still taken.
        assert!(parse(&["status", "m", "--watch"]).follows());
        assert!(parse(&["--version", "2", "status", "m"]).command().is_err());
        assert!(parse(&["--follow", "status", "m"]).command().is_err());
    }
}
