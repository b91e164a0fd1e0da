//! What a version is made of, split in two: its processing files and the
//! rest (the graph and its weights), each a digest of the manifest's
//! entries. A version whose rest equals its predecessor's and whose
//! processing does not is a processing update.

use baton_core::files::manifest::Manifest;
use sha2::{Digest, Sha256};

/// The two digests of a version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    graph: [u8; 32],
    processing: [u8; 32],
}

impl Identity {
    /// The identity of a version of `manifest`, whose processing reads
    /// `processing` (paths relative to the version).
    pub fn of(manifest: &Manifest, processing: &[String]) -> Identity {
        let (mut graph, mut own) = (Sha256::new(), Sha256::new());
        // Digests of different formats never compare equal.
        let format = format!("{:?}\n", manifest.format);
        graph.update(format.as_bytes());
        own.update(format.as_bytes());
        for entry in &manifest.entries {
            let line = format!("{}\0{}\0{}\n", entry.path, entry.size, entry.sha256);
            if processing.contains(&entry.path) { own.update(line.as_bytes()) } else { graph.update(line.as_bytes()) }
        }
        Identity { graph: graph.finalize().into(), processing: own.finalize().into() }
    }

    /// Whether only the processing changed since `previous`.
    pub fn processing_only_since(&self, previous: &Identity) -> bool {
        self.graph == previous.graph && self.processing != previous.processing
    }
}

#[cfg(test)]
mod tests {
    use baton_core::files::manifest::Entry;

    use super::*;

    fn manifest(files: &[(&str, &str)]) -> Manifest {
        let entries = files
            .iter()
            .map(|(path, sha256)| Entry { path: (*path).into(), size: 1, sha256: (*sha256).into() })
            .collect();
        Manifest { entries, ..Manifest::default() }
    }

    #[test]
    fn only_a_changed_processing_file_is_a_processing_update() {
        let processing = vec!["tokenizer.json".to_owned()];
        let of = |graph: &str, tokenizer: &str| {
            Identity::of(&manifest(&[("model.onnx", graph), ("tokenizer.json", tokenizer)]), &processing)
        };
        let first = of("g1", "t1");
        assert!(of("g1", "t2").processing_only_since(&first));
        assert!(!of("g2", "t2").processing_only_since(&first), "a new graph too");
        assert!(!of("g2", "t1").processing_only_since(&first), "a new graph alone");
        assert!(!of("g1", "t1").processing_only_since(&first), "nothing changed");
    }
}
