//! docs/reference.md held to the code: every flag clap defines (hidden ones
//! left out) and every `model.toml` key the parsers read has a row, every
//! row names something real, and every default the page gives in backticks
//! is the one the code applies. A failure says which row to add, remove or
//! change.

use std::cell::Cell;
use std::collections::BTreeMap;

use clap::CommandFactory;

use baton_core::files::spec::ModelSpec;

/// The page.
const REFERENCE: &str = include_str!("../../../docs/reference.md");

/// The part of the page the flags are in, and the one for `model.toml`.
const FLAGS_PART: &str = "## Command line";
const MODEL_PART: &str = "## `model.toml`";

/// One row of a table of the page.
struct Row {
    /// The command it belongs to (`serve`, `fleet rollout`), or its
    /// `model.toml` section (`policy`; empty for the top level), from the
    /// `### ` heading it is under.
    section: String,
    /// The flag (`--repo`) or key (`keep_previous`).
    key: String,
    /// The default, when the row gives one in backticks.
    default: Option<String>,
    /// Its line on the page, from 1.
    line: usize,
}

/// The first text in backticks, if any.
fn backticked(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once('`')?;
    rest.split_once('`').map(|(inside, _)| inside)
}

/// The command paths a heading's name stands for, as in a usage line:
/// `rollout start|status` is `rollout start` and `rollout status`, and
/// `rollout [pause|abort]` also `rollout` itself.
fn commands(name: &str) -> Vec<String> {
    let mut paths = vec![String::new()];
    for word in name.split_whitespace() {
        let (choices, optional) = match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(inside) => (inside, true),
            None => (word, false),
        };
        let mut words: Vec<&str> = choices.split('|').collect();
        if optional {
            words.push("");
        }
        paths = paths.iter().flat_map(|p| words.iter().map(move |w| format!("{p} {w}").trim().to_owned())).collect();
    }
    paths
}

#[test]
fn a_heading_names_commands_as_a_usage_line_does() {
    assert_eq!(commands("serve"), ["serve"]);
    assert_eq!(commands(""), [""]);
    assert_eq!(commands("rollout start|status"), ["rollout start", "rollout status"]);
    assert_eq!(commands("fleet [pause|abort]"), ["fleet pause", "fleet abort", "fleet"]);
}

/// The rows of the tables under `part`.
fn rows(part: &str) -> Vec<Row> {
    let mut inside = false;
    let mut sections = vec![String::new()];
    let mut rows = Vec::new();
    for (i, line) in REFERENCE.lines().enumerate() {
        if let Some(heading) = line.strip_prefix("## ") {
            inside = format!("## {heading}") == part;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(heading) = line.strip_prefix("### ") {
            // A heading may name several commands whose flags are the
            // same (`baton serve`, `baton agent`, `baton rollout
            // start|status`); a `model.toml` heading names its section
            // (`[policy]`), or none for the top level.
            let named: Vec<&str> = heading.split('`').skip(1).step_by(2).collect();
            let commands: Vec<String> =
                named.iter().filter_map(|n| n.strip_prefix("baton")).flat_map(|n| commands(n.trim())).collect();
            sections = match (commands.is_empty(), named.first()) {
                (false, _) => commands,
                (true, Some(name)) => vec![name.trim_matches(['[', ']']).to_owned()],
                (true, None) => vec![String::new()],
            };
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() < 4 || cells[1].starts_with("---") {
            continue;
        }
        let Some(key) = backticked(cells[1]).and_then(|k| k.split_whitespace().next()) else { continue };
        for section in &sections {
            rows.push(Row {
                section: section.clone(),
                key: key.to_owned(),
                default: backticked(cells[2]).map(str::to_owned),
                line: i + 1,
            });
        }
    }
    rows
}

/// What clap says of one flag.
struct Flag {
    /// Its default, values joined by `,`.
    default: Option<String>,
    /// Its help text.
    help: String,
    /// The environment variable it also reads.
    env: Option<String>,
}

/// Every visible flag of `command` and its subcommands, by command path
/// (`serve`, `fleet rollout`), with clap's default (values joined by `,`).
fn flags(command: &clap::Command, path: &str, out: &mut BTreeMap<(String, String), Flag>) {
    for arg in command.get_arguments() {
        // Clap's own --help and --version are left out; a command's flag
        // that happens to be called --version (`baton load`) is not.
        let generated = matches!(
            arg.get_action(),
            clap::ArgAction::Help | clap::ArgAction::HelpShort | clap::ArgAction::HelpLong | clap::ArgAction::Version
        );
        if arg.is_hide_set() || generated {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        let defaults: Vec<String> = arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let default = (!defaults.is_empty()).then(|| defaults.join(","));
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        out.insert((path.to_owned(), format!("--{long}")), Flag { default, help, env });
    }
    for sub in command.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let path = format!("{path} {}", sub.get_name()).trim().to_owned();
        flags(sub, &path, out);
    }
}

/// The fields a `Deserialize` struct names: serde hands them to the
/// deserializer, which keeps them and stops.
fn fields<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    let seen = Cell::new(&[][..]);
    let _ = T::deserialize(Probe(&seen));
    let fields = seen.get();
    assert!(!fields.is_empty(), "{} names no fields", std::any::type_name::<T>());
    fields
}

/// A deserializer that only records the fields of the struct asked for.
struct Probe<'a>(&'a Cell<&'static [&'static str]>);

/// What [`Probe`] answers to everything.
#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probed")
    }
}

impl std::error::Error for Stop {}

impl serde::de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> serde::Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.0.set(fields);
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// Every `model.toml` section's keys, from the parsers: the spec's structs
/// and the `[engine]` keys of the ONNX backend and of baton's workers.
fn model_keys() -> BTreeMap<&'static str, Vec<&'static str>> {
    use baton_core::files::rollout_spec::{Guards, MetricGuard, RolloutPolicy};
    use baton_core::files::spec;
    let mut keys = BTreeMap::new();
    keys.insert("", fields::<spec::ModelSpec>().to_vec());
    keys.insert("policy", fields::<spec::Policy>().to_vec());
    keys.insert("validation", fields::<spec::ValidationPolicy>().to_vec());
    keys.insert("warmup", fields::<spec::WarmupPolicy>().to_vec());
    keys.insert("batching", fields::<spec::BatchingPolicy>().to_vec());
    keys.insert("admission", fields::<spec::AdmissionPolicy>().to_vec());
    keys.insert("rollout", fields::<RolloutPolicy>().to_vec());
    keys.insert("rollout.guards", fields::<Guards>().to_vec());
    keys.insert("rollout.guards.metrics", fields::<MetricGuard>().to_vec());
    keys.insert("inputs", fields::<baton_core::tensors::signature::TensorSpec>().to_vec());
    let mut engine = baton_onnx::ENGINE_KEYS.to_vec();
    engine.extend(baton_worker::ENGINE_KEYS);
    keys.insert("engine", engine);
    keys
}

/// Whether `key = value` in `section` reads as leaving the key out does;
/// `None` for sections of arrays, whose entries need other keys.
fn reads_as_default(section: &str, key: &str, value: &str) -> Option<Result<bool, String>> {
    let text = match section {
        "" => format!("{key} = {value}\n"),
        "rollout.guards.metrics" | "inputs" => return None,
        _ => format!("[{section}]\n{key} = {value}\n"),
    };
    let parsed = ModelSpec::parse(&text);
    Some(match (section, parsed) {
        (_, Err(e)) => Err(e),
        ("engine", Ok(spec)) if baton_worker::ENGINE_KEYS.contains(&key) => {
            baton_worker::reads_as_default(&spec).map_err(|e| e.to_string())
        }
        ("engine", Ok(spec)) => {
            let given = baton_onnx::EngineOptions::parse(&spec.engine).map_err(|e| e.to_string());
            given.map(|options| options == baton_onnx::EngineOptions::default())
        }
        (_, Ok(spec)) => Ok(format!("{:?}", Ok::<_, String>(spec)) == format!("{:?}", ModelSpec::parse(""))),
    })
}

#[test]
fn every_flag_has_a_row_with_its_default() {
    let mut command = crate::Cli::command();
    command.build();
    let mut code = BTreeMap::new();
    flags(&command, "", &mut code);
    let mut problems = Vec::new();
    let page = rows(FLAGS_PART);
    for ((cmd, flag), Flag { default, help, env }) in &code {
        if let Some(env) = env.as_ref().filter(|env| !REFERENCE.contains(env.as_str())) {
            problems.push(format!("`{env}`, which `baton {cmd} {flag}` also reads, is nowhere on the page"));
        }
        let Some(row) = page.iter().find(|r| &r.section == cmd && &r.key == flag) else {
            let default = default.as_ref().map_or("none".to_owned(), |d| format!("`{d}`"));
            let what = help.lines().next().unwrap_or_default();
            problems.push(format!(
                "no row for `{flag}` under \"### `baton {cmd}`\" (or a shared heading naming it); add: | `{flag}` | \
                 {default} | UNIT | {what} |"
            ));
            continue;
        };
        if row.default != *default {
            problems.push(format!(
                "line {}: `baton {cmd} {flag}` defaults to {}, the page says {}",
                row.line,
                default.as_ref().map_or("nothing (write its default without backticks, e.g. none)".into(), |d| {
                    format!("`{d}`")
                }),
                row.default.as_ref().map_or("nothing in backticks".into(), |d| format!("`{d}`"))
            ));
        }
    }
    for row in &page {
        if !code.contains_key(&(row.section.clone(), row.key.clone())) {
            problems.push(format!(
                "line {}: `baton {} {}` is no visible flag (hidden flags and old spellings stay off the page); \
                 remove the row or fix its name",
                row.line, row.section, row.key
            ));
        }
    }
    assert!(problems.is_empty(), "docs/reference.md is out of step with the flags:\n{}", problems.join("\n"));
}

#[test]
fn every_model_toml_key_has_a_row_with_its_default() {
    let code = model_keys();
    let page = rows(MODEL_PART);
    let mut problems = Vec::new();
    for (section, keys) in &code {
        for key in keys {
            // A key that is a section of its own has its own heading.
            let nested = if section.is_empty() { key.to_string() } else { format!("{section}.{key}") };
            if code.contains_key(nested.as_str()) {
                continue;
            }
            if !page.iter().any(|r| r.section == *section && r.key == *key) {
                problems.push(format!(
                    "no row for `{key}` under the heading of `[{section}]` (a new section of its own also needs its \
                     struct in model_keys() here and a heading on the page)"
                ));
            }
        }
    }
    for row in &page {
        if !code.get(row.section.as_str()).is_some_and(|keys| keys.contains(&row.key.as_str())) {
            problems.push(format!(
                "line {}: `{}` in `[{}]` is no key the parser reads; remove the row or fix its name",
                row.line, row.key, row.section
            ));
            continue;
        }
        let Some(default) = &row.default else { continue };
        match reads_as_default(&row.section, &row.key, default) {
            None | Some(Ok(true)) => {}
            Some(Ok(false)) => problems.push(format!(
                "line {}: `{} = {default}` in `[{}]` is not the default: the parser reads it differently from \
                 leaving the key out",
                row.line, row.key, row.section
            )),
            Some(Err(e)) => problems.push(format!(
                "line {}: the default `{default}` of `{}` in `[{}]` does not parse: {e}",
                row.line, row.key, row.section
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "docs/reference.md is out of step with model.toml's parsers:\n{}",
        problems.join("\n")
    );
}
