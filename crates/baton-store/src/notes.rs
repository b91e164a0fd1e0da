//! What a lowered thread has to say, said later by a thread that may log.
//!
//! Downloads run on the loader's thread and the store client's threads, at
//! the loader's priority. Such threads take no lock that serving threads
//! take, and logging takes one, so they leave notes here instead; the
//! store's lister, at normal priority, logs them at its next tick.

use std::sync::Mutex;

/// One thing worth a log line.
#[derive(Debug)]
pub enum Note {
    /// A version was found in the cache and not downloaded.
    CacheHit { model: String, version: u64, dir: String },
    /// A version that does not serve was evicted to make room.
    Evicted { model: String, version: u64 },
    /// A version was downloaded and hashed into the cache.
    Downloaded { model: String, version: u64, bytes: u64, ms: u64 },
    /// A ranged read failed and is asked for again from its first missing byte.
    Resumed { object: String, at: u64, attempt: u32, error: String },
    /// An object of a version changed while it was being downloaded; the
    /// download starts over on what the store holds now.
    Restarted { model: String, version: u64, error: String },
}

/// Notes waiting to be logged. Only lowered threads and the lister take
/// its lock; a bounded number is kept, the oldest dropped first.
#[derive(Debug, Default)]
pub struct Notes(Mutex<Vec<Note>>);

/// More notes than the lister would log in one tick are not kept.
const MOST: usize = 256;

impl Notes {
    /// Leaves a note.
    pub fn push(&self, note: Note) {
        let mut notes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if notes.len() >= MOST {
            notes.remove(0);
        }
        notes.push(note);
    }

    /// Logs every note left, oldest first. Only for threads that may log.
    pub fn log(&self, store: &str) {
        let notes = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for note in notes {
            match note {
                Note::CacheHit { model, version, dir } => {
                    tracing::info!(store, model, version, dir, "The version is in the cache; nothing to download.");
                }
                Note::Evicted { model, version } => {
                    tracing::info!(store, model, version, "Evicted a version that does not serve from the cache.");
                }
                Note::Downloaded { model, version, bytes, ms } => {
                    tracing::info!(store, model, version, bytes, ms, "Downloaded and hashed a version into the cache.");
                }
                Note::Restarted { model, version, error } => {
                    tracing::warn!(
                        store,
                        model,
                        version,
                        error,
                        "The version changed in the store while it was being downloaded; starting over on what it holds now."
                    );
                }
                Note::Resumed { object, at, attempt, error } => {
                    tracing::warn!(
                        store,
                        object,
                        at,
                        attempt,
                        error,
                        "A ranged read failed; resuming at the first byte not received."
                    );
                }
            }
        }
    }
}
