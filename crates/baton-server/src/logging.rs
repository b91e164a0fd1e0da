//! Where baton's log goes and in what form: lines for people on stderr,
//! coloured only when stderr is a terminal (and `NO_COLOR` is unset), or
//! JSON lines for a log shipper (`baton serve --log-format json`).
//! `BATON_LOG` filters, as `RUST_LOG` does elsewhere.

use std::io::IsTerminal;

/// The form of the log's lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event: time, level, target, message, `field=value`.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target` and
    /// `fields` (the message under `message`, beside the event's fields).
    Json,
}

/// Installs the log for the process, filtered by `BATON_LOG`, else by
/// `default_filter`.
pub fn init(default_filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG").unwrap_or_else(|_| default_filter.into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colours).init();
        }
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}
