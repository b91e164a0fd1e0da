//! What a store holds, as of its last listing: models, their `model.toml`,
//! and their complete versions (those with a MANIFEST), with every object's
//! size.
//!
//! One listing costs one request for the models and one per model (the
//! model's objects, recursively), plus a download of each `model.toml` whose
//! tag changed.

use std::collections::BTreeMap;

use baton_core::files::manifest::MANIFEST;
use baton_core::files::source::FetchError;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};

use crate::errors::fetch_error;

/// A store's content as of one listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Models by name.
    pub models: BTreeMap<String, ModelListing>,
}

/// One model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelListing {
    /// Its `model.toml`.
    pub spec: String,
    /// The store's tag of that `model.toml`.
    pub spec_tag: String,
    /// Its complete versions.
    pub versions: BTreeMap<u64, VersionListing>,
}

/// One complete version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionListing {
    /// The store's tag of its MANIFEST: a new one means a new publication.
    pub manifest_tag: String,
    /// Every object below the version, by path relative to it, with its size.
    pub sizes: BTreeMap<String, u64>,
    /// The entity tag of every object that has one, as the store gave it:
    /// each read of the object asks for this content and no other.
    pub etags: BTreeMap<String, String>,
}

/// What identifies an object's content in a listing: its entity tag where
/// the store gives one, else its size and modification time.
pub fn tag(meta: &ObjectMeta) -> String {
    match &meta.e_tag {
        Some(tag) => tag.trim_matches('"').to_owned(),
        None => format!("{}-{}", meta.size, meta.last_modified.timestamp_nanos_opt().unwrap_or_default()),
    }
}

/// Whether two entity tags name the same content: equal once their
/// quotes and any weak marker are set aside (stores differ in which they
/// give in listings and in answers).
pub fn same_etag(a: &str, b: &str) -> bool {
    let bare = |t: &str| t.trim().trim_start_matches("W/").trim_matches('"').to_owned();
    bare(a) == bare(b)
}

/// Whether `name` can name a model (as on disk).
pub fn valid_model(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\'])
}

/// Lists the store under `prefix`, reusing `previous`'s `model.toml` texts
/// whose tags did not change. `url` names the store in errors.
pub async fn list(
    store: &dyn ObjectStore,
    prefix: &Path,
    url: &str,
    previous: &Snapshot,
) -> Result<Snapshot, FetchError> {
    let top = (!prefix.as_ref().is_empty()).then_some(prefix);
    let listed = store.list_with_delimiter(top).await.map_err(|e| fetch_error(&format!("listing {url}"), &e))?;
    let mut snapshot = Snapshot::default();
    for model_prefix in listed.common_prefixes {
        let Some(name) = model_prefix.filename().map(str::to_owned) else { continue };
        if !valid_model(&name) {
            continue;
        }
        let doing = format!("listing model '{name}' in {url}");
        let objects: Vec<ObjectMeta> =
            store.list(Some(&model_prefix)).try_collect().await.map_err(|e| fetch_error(&doing, &e))?;
        let mut model = ModelListing::default();
        let mut spec = None;
        let mut manifests = BTreeMap::new();
        for meta in &objects {
            let Some(parts) = meta.location.prefix_match(&model_prefix) else { continue };
            let parts: Vec<String> = parts.map(|p| p.as_ref().to_owned()).collect();
            match parts.as_slice() {
                [file] if file == "model.toml" => spec = Some(meta),
                [number, rest @ ..] if !rest.is_empty() => {
                    let Ok(version) = number.parse::<u64>() else { continue };
                    let relative = rest.join("/");
                    if relative == MANIFEST {
                        manifests.insert(version, tag(meta));
                    }
                    let listed = model.versions.entry(version).or_default();
                    if let Some(etag) = &meta.e_tag {
                        listed.etags.insert(relative.clone(), etag.clone());
                    }
                    listed.sizes.insert(relative, meta.size);
                }
                _ => {}
            }
        }
        // A model without model.toml is not a model, as on disk.
        let Some(spec) = spec else { continue };
        model.spec_tag = tag(spec);
        model.spec = match previous.models.get(&name) {
            Some(before) if before.spec_tag == model.spec_tag => before.spec.clone(),
            _ => {
                let doing = format!("reading {url}/{name}/model.toml");
                let got = store.get(&spec.location).await.map_err(|e| fetch_error(&doing, &e))?;
                let bytes = got.bytes().await.map_err(|e| fetch_error(&doing, &e))?;
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        model.versions.retain(|v, _| manifests.contains_key(v));
        for (version, manifest_tag) in manifests {
            if let Some(listing) = model.versions.get_mut(&version) {
                listing.manifest_tag = manifest_tag;
            }
        }
        snapshot.models.insert(name, model);
    }
    Ok(snapshot)
}
