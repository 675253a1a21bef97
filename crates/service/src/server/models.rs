//! The models this server answers for ([`Models`]): the default one and
//! each `[models.<name>]`, every one its own teachers ([`Ensemble`]) and
//! input shape, and each over a dataset, so that every model of a dataset
//! steps the same sessions (one posterior over its m subsets and one
//! ledger per principal: `docs/assurance/accounting.md` §10).
//!
//! # Invariants
//! - Every model of a dataset has its m teachers, teacher i trained on
//!   subset i: m is checked at start; the subsets are the operator's
//!   declaration (for the demo teachers, checked: the same seed).
//! - A session's answer cache keys a query by its model (and version) as
//!   well as by its input, so one model's answer is never returned for
//!   another's. The default model keys a query as every earlier release
//!   did, so the caches it wrote carry over.
//! - Which model a request names is public (the client chose it): it
//!   selects teachers and a cache key, never anything about s*.

use super::input::InputSpec;
use super::status::ServiceError;
use crate::session::cache::QueryDigest;
use crate::session::{DatasetIndex, ModelTag};
use crate::teachers::Ensemble;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The only version of every model.
pub const MODEL_VERSION: &str = "1";

/// What a model is built from.
pub struct Served {
    /// Its name on the wire.
    pub name: String,
    /// Its dataset's position in the registry.
    pub dataset: DatasetIndex,
    /// Its m teachers.
    pub ensemble: Ensemble,
    /// What an input example looks like.
    pub input: InputSpec,
}

/// One model: its teachers and what its input looks like.
pub struct Model {
    /// Its name on the wire.
    pub name: String,
    /// Its m teachers.
    pub ensemble: Ensemble,
    /// What an input example looks like.
    pub input: InputSpec,
    /// The dataset its teachers were trained on: whose sessions its
    /// answers step.
    pub dataset: DatasetIndex,
    /// Its name and version, as the journal records them.
    tag: ModelTag,
    /// The default model's cache keys are the input's digest alone.
    default: bool,
    /// Whether the last probe found every one of its teachers ready.
    ready: AtomicBool,
}

impl Model {
    /// Its name and version, as the journal records them.
    pub fn tag(&self) -> &ModelTag {
        &self.tag
    }

    /// Whether the last probe found every one of its teachers ready.
    pub fn teachers_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Records a probe of its teachers.
    pub fn set_teachers_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The answer cache's digest of an input whose digest is `input`,
    /// asked of this model.
    pub fn digest(&self, input: QueryDigest) -> QueryDigest {
        if self.default { input } else { input.of_model(&self.name, MODEL_VERSION) }
    }
}

/// Every model, by name; one of them the default.
pub struct Models {
    default: Arc<Model>,
    /// The others, in name order.
    more: Vec<Arc<Model>>,
}

impl Models {
    /// The default model `(name, ensemble, input)` and `more`, whose names
    /// are distinct (the settings checked).
    pub fn new(default: Served, more: Vec<Served>) -> Self {
        let model = |Served { name, dataset, ensemble, input }, default| {
            let tag = ModelTag { name: name.as_str().into(), version: MODEL_VERSION.into() };
            Arc::new(Model { name, ensemble, input, dataset, tag, default, ready: false.into() })
        };
        Models { default: model(default, true), more: more.into_iter().map(|m| model(m, false)).collect() }
    }

    /// Every model, the default first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Model>> {
        std::iter::once(&self.default).chain(&self.more)
    }

    /// The model called `name`, or the default one if `name` is empty
    /// (`PredictRequest.model`).
    ///
    /// # Errors
    /// [`ServiceError::NotFound`], listing what is served.
    pub fn get(&self, name: &str) -> Result<&Arc<Model>, ServiceError> {
        if name.is_empty() { Ok(&self.default) } else { self.named(name, "") }
    }

    /// The model called `name` at `version` (empty: the newest), as the
    /// Open Inference Protocol names a model.
    ///
    /// # Errors
    /// [`ServiceError::NotFound`], listing what is served.
    pub fn named(&self, name: &str, version: &str) -> Result<&Arc<Model>, ServiceError> {
        match self.iter().find(|m| m.name == name) {
            Some(model) if version.is_empty() || version == MODEL_VERSION => Ok(model),
            _ => {
                let names: Vec<String> = self.iter().map(|m| format!("{:?}", m.name)).collect();
                // The client's words are echoed, but never more than a name's length.
                let (name, version) = (clip(name), clip(version));
                Err(ServiceError::NotFound(format!(
                    "model {name:?} version {version:?} is not served here: this pacpriv serves {} (version \
                     \"{MODEL_VERSION}\" or empty; an empty model name is {:?})",
                    names.join(", "),
                    self.default.name
                )))
            }
        }
    }
}

/// At most 64 characters of `s`: a model name or version a client sent,
/// as an error echoes it.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}
