//! [`ProcessingBackend`]: wraps an engine's backend so that a version
//! whose directory declares processing runs it around its graph, in the
//! version's own snapshot. A version that declares none is the inner
//! backend's model, untouched.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use baton_core::files::spec::ModelSpec;
use baton_core::files::verified::Verified;
use baton_core::run::backend::{
    Backend, BackendError, InputRange, Model, ProcessInfo, UpdateKind, UpdateReason, Weight, WeightsError, WeightsInfo,
};
use baton_core::tensors::signature::Signature;
use baton_core::tensors::tensor::Tensor;

use crate::declaration::{Declaration, PreSpec, read_file, read_text};
use crate::error::ProcessingError;
use crate::features::FeatureSpec;
use crate::identity::Identity;
use crate::post::Post;
use crate::tokenize::TextTokenizer;

/// An engine's backend whose versions may carry their processing.
pub struct ProcessingBackend {
    inner: Arc<dyn Backend>,
    /// The identity of the version of each model (by its directory) loaded
    /// last: what tells a processing update from another.
    last: Mutex<HashMap<PathBuf, Identity>>,
}

impl ProcessingBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> ProcessingBackend {
        // Tokenizing runs on the calling session thread, never on a pool
        // of the tokenizers crate's own.
        tokenizers::utils::parallelism::set_parallelism(false);
        ProcessingBackend { inner, last: Mutex::new(HashMap::new()) }
    }

    fn wrap(&self, version: &Verified, model: Box<dyn Model>) -> Result<Box<dyn Model>, BackendError> {
        let declaration = Declaration::read(version)?;
        let files = declaration.as_ref().map_or(&[][..], |d| &d.files[..]);
        let identity = Identity::of(version.manifest(), files);
        let model_dir = version.dir().parent().map(PathBuf::from).unwrap_or_default();
        let previous = self.last.lock().unwrap_or_else(PoisonError::into_inner).get(&model_dir).cloned();
        let processing_only = previous.is_some_and(|p| identity.processing_only_since(&p));
        // A version that declares nothing is the engine's model as it is,
        // unless it only dropped the processing of the version before it.
        let Some(declaration) = declaration else {
            self.remember(model_dir, identity);
            if processing_only {
                let signature = model.signature().clone();
                return Ok(Box::new(Processed { inner: model, pre: None, post: None, signature, processing_only }));
            }
            return Ok(model);
        };
        let processed = Processed::load(version, &declaration, model, processing_only)?;
        self.remember(model_dir, identity);
        tracing::info!(
            dir = %version.dir().display(),
            inputs = ?processed.signature.inputs.iter().map(|s| &s.name).collect::<Vec<_>>(),
            outputs = ?processed.signature.outputs.iter().map(|s| &s.name).collect::<Vec<_>>(),
            processing_only,
            "The version runs its own processing around its graph."
        );
        Ok(Box::new(processed))
    }

    /// Records the identity of the version of a model loaded last.
    fn remember(&self, model_dir: PathBuf, identity: Identity) {
        self.last.lock().unwrap_or_else(PoisonError::into_inner).insert(model_dir, identity);
    }
}

impl Backend for ProcessingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn load(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        let model = self.inner.load(version, spec)?;
        self.wrap(version, model)
    }

    fn load_alone(&self, version: &Verified, spec: &ModelSpec) -> Result<Box<dyn Model>, BackendError> {
        let model = self.inner.load_alone(version, spec)?;
        self.wrap(version, model)
    }

    fn maps_as_is(&self, path: &str, size: u64) -> bool {
        self.inner.maps_as_is(path, size)
    }
}

/// What runs before the graph, loaded.
enum Pre {
    Tokenizer(Box<TextTokenizer>),
    /// Raw named features to the graph's inputs, with no attention mask.
    Features(FeatureSpec),
}

/// A graph with its processing around it.
struct Processed {
    inner: Box<dyn Model>,
    pre: Option<Pre>,
    post: Option<Post>,
    signature: Signature,
    processing_only: bool,
}

impl Processed {
    fn load(
        version: &Verified,
        declaration: &Declaration,
        inner: Box<dyn Model>,
        processing_only: bool,
    ) -> Result<Processed, ProcessingError> {
        let graph = inner.signature().clone();
        let mut signature = graph.clone();
        let pre = match &declaration.pre {
            None => None,
            Some(PreSpec::Tokenizer(spec)) => {
                let json = read_file(version, &spec.file)?
                    .ok_or_else(|| ProcessingError::invalid(format!("{}: the version has no such file", spec.file)))?;
                let tokenizer = TextTokenizer::load(&json, spec, &graph)?;
                signature.inputs = vec![tokenizer.client_input()];
                Some(Pre::Tokenizer(Box::new(tokenizer)))
            }
            Some(PreSpec::Features(spec)) => {
                spec.check_against(&graph)?;
                signature.inputs = spec.inputs();
                Some(Pre::Features(spec.clone()))
            }
        };
        let post = match &declaration.output {
            None => None,
            Some(spec) => {
                let labels = match &spec.labels {
                    Some(path) => Some(
                        read_text(version, path)?
                            .ok_or_else(|| ProcessingError::invalid(format!("{path}: the version has no such file")))?,
                    ),
                    None => None,
                };
                let masked = matches!(pre, Some(Pre::Tokenizer(_)));
                let post = Post::load(spec, &graph, labels.as_deref(), masked)?;
                signature.outputs = post.outputs().to_vec();
                Some(post)
            }
        };
        Ok(Processed { inner, pre, post, signature, processing_only })
    }

    /// Pre-processing, the graph (on `instance` when one is named), then
    /// post-processing, all on the calling thread.
    fn run(&self, instance: Option<usize>, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        let (graph_inputs, mask) = match &self.pre {
            None => (None, None),
            Some(Pre::Tokenizer(tokenizer)) => {
                let tokens = tokenizer.run(inputs)?;
                (Some(tokens.inputs), Some(tokens.mask))
            }
            Some(Pre::Features(spec)) => (Some(spec.apply(inputs).map_err(ProcessingError::from)?), None),
        };
        let graph_inputs = graph_inputs.as_deref().unwrap_or(inputs);
        let outputs = match instance {
            Some(instance) => self.inner.infer_on(instance, graph_inputs)?,
            None => self.inner.infer(graph_inputs)?,
        };
        match &self.post {
            None => Ok(outputs),
            Some(post) => Ok(post.run(outputs, mask.as_deref())?),
        }
    }
}

impl Model for Processed {
    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn visit_weights(&self, visit: &mut dyn FnMut(&Weight<'_>) -> Result<(), String>) -> Result<(), WeightsError> {
        self.inner.visit_weights(visit)
    }

    fn input_ranges(&self) -> Vec<InputRange> {
        // Texts and raw features have no integer range; other inputs pass
        // to the graph as they are.
        match self.pre {
            Some(Pre::Tokenizer(_) | Pre::Features(_)) => Vec::new(),
            None => self.inner.input_ranges(),
        }
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.run(None, inputs)
    }

    fn runs_inline(&self) -> bool {
        // Processing runs on a session thread, never on an async worker.
        self.pre.is_none() && self.post.is_none()
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn infer_on(&self, instance: usize, inputs: &[Tensor]) -> Result<Vec<Tensor>, BackendError> {
        self.run(Some(instance), inputs)
    }

    fn weights(&self) -> WeightsInfo {
        let mut info = self.inner.weights();
        // A version whose graph and weights are its predecessor's, loaded in
        // the server's process, is a processing update; a reason another
        // part decided (a worker process) stands.
        if self.processing_only && info.reason.is_none() && info.update != UpdateKind::Runtime {
            info.reason = Some(UpdateReason::ProcessingOnly);
        }
        info
    }

    fn alive(&self) -> bool {
        self.inner.alive()
    }

    fn on_exit(&self, notify: Box<dyn FnOnce(String) + Send>) {
        self.inner.on_exit(notify);
    }

    fn process(&self) -> Option<ProcessInfo> {
        self.inner.process()
    }
}
