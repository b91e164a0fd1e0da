//! The `baton` command.
//!
//! `baton package DIR` seals a version directory by writing its MANIFEST —
//! every file's size and SHA-256, written last so a half-copied version is
//! never mistaken for a complete one. The server itself (`baton serve`)
//! builds on the same registry.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// baton: a model-inference server where updating a model is a non-event.
#[derive(Parser)]
#[command(name = "baton", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write DIR/MANIFEST listing every file of a version with its size and SHA-256.
    Package {
        /// The version directory, e.g. models/ranker/3.
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Package { dir } => {
            anyhow::ensure!(dir.is_dir(), "{} is not a directory", dir.display());
            let manifest = baton_core::manifest::write(&dir).with_context(|| format!("packaging {}", dir.display()))?;
            println!(
                "Wrote {} listing {} files, {} bytes.",
                dir.join(baton_core::manifest::MANIFEST).display(),
                manifest.entries.len(),
                manifest.total_bytes()
            );
        }
    }
    Ok(())
}
