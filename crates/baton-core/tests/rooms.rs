//! The core's rooms import only the rooms below them (docs/core-layout.md):
//! every `crate::ROOM` that a file's code names (comments are not read) is
//! a room on a lower floor than the file's own, and every top-level module
//! is one of the rooms below.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The rooms from the ground up; a room may import those before it on a
/// lower floor. Rooms on one floor import each other not at all.
const FLOORS: &[&[&str]] = &[&["tensors", "human", "threads"], &["files"], &["run"], &["rollout"], &["registry"]];

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|floor| floor.contains(&room))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms a file's code names as `crate::ROOM`, comments left out.
fn named_rooms(text: &str) -> Vec<String> {
    let mut rooms = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let before = code[..at].chars().next_back();
            if !name.is_empty() && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                rooms.push(name);
            }
        }
    }
    rooms
}

#[test]
fn every_room_imports_only_rooms_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let room = first.trim_end_matches(".rs");
        if room == "lib" {
            continue;
        }
        let Some(own) = floor_of(room) else {
            wrong.insert(format!("{}: `{room}` is no room of the core", relative.display()));
            continue;
        };
        for other in named_rooms(&fs::read_to_string(file).unwrap()) {
            if other == room {
                continue;
            }
            if floor_of(&other).is_none_or(|floor| floor >= own) {
                wrong.insert(format!("{} ({room}) imports crate::{other}", relative.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that run up or sideways between rooms:\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn an_import_running_up_is_seen() {
    assert_eq!(named_rooms("use crate::registry::Registry; // crate::run"), ["registry"]);
    assert!(named_rooms("/// [`crate::registry`]").is_empty());
    assert!(named_rooms("use other_crate::registry::X;").is_empty());
}
