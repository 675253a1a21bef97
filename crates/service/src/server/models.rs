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
//! - A session's answer cache keys a query by its model, version and the
//!   version's stored identity (its teachers) as well as by its input, so
//!   one model's answer is never returned for another's, nor a version's
//!   for other teachers given its number. The versions a store from an
//!   earlier release already served key a query as that release did, so
//!   the caches it wrote carry over ([`CacheKeying`]).
//! - Which model a request names is public (the client chose it): it
//!   selects teachers and a cache key, never anything about s*.
//! - A model has versions (`[versions.<name>.<V>]`): each its own teachers
//!   over the same subsets, so each steps the same sessions. An empty
//!   version is the newest loaded one whose teachers are ready (else the
//!   newest loaded one) — public facts, as the repository index shows.
//! - Loading and unloading (the admin listener's `RepositoryModelLoad` /
//!   `RepositoryModelUnload`) only decide which versions new requests may
//!   resolve to: a request that resolved a version before it was unloaded
//!   finishes on it; one that names an unloaded version is refused before
//!   anything is asked or charged.

use super::input::InputSpec;
use super::statistics::Statistics;
use super::status::ServiceError;
use crate::metrics::ServiceMetrics;
use crate::session::cache::QueryDigest;
use crate::session::{DatasetIndex, ModelTag};
use crate::teachers::Ensemble;
use pacpriv_store::{LegacyKey, VersionIdentity};
use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio_util::sync::DropGuard;

/// What a model version is built from.
pub struct Served {
    /// Its name on the wire.
    pub name: String,
    /// Its version ("1", or a `[versions.<name>.<V>]`).
    pub version: String,
    /// Its dataset's position in the registry.
    pub dataset: DatasetIndex,
    /// Its m teachers.
    pub ensemble: Ensemble,
    /// What an input example looks like.
    pub input: InputSpec,
    /// Stops its teachers' own tasks (the demo's server) when dropped:
    /// with the last request that holds the version.
    pub teachers_running: DropGuard,
}

/// One version of a model: its teachers and what its input looks like.
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
    /// Its version as a number (newest = largest).
    number: u64,
    /// How it keys its answers in a session's cache.
    keying: CacheKeying,
    /// Whether the last probe found every one of its teachers ready.
    ready: AtomicBool,
    /// Whether new requests may resolve to it (load / unload).
    loaded: AtomicBool,
    /// Its counts and durations (Triton's statistics extension): from
    /// when it was built, carried by a reload that keeps it.
    pub stats: Statistics,
    /// Its series of answers released (`pacpriv_model_answers`), resolved
    /// at its first answer: a version a rejected reload built and never
    /// served exports none.
    answers: OnceLock<Counter>,
    /// Ends its teachers' own tasks once it is dropped.
    _teachers_running: DropGuard,
}

/// How a model version keys its answers in a session's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheKeying {
    /// By its name, version and stored identity.
    Identity(String),
    /// As the releases before stored identities did, for a version a
    /// store from them was configured with when this release first
    /// started on it ([`pacpriv_store::VersionIdentity::legacy`]).
    Legacy(LegacyKey),
}

impl CacheKeying {
    /// The keying of a version whose stored identity is `stored`.
    pub fn of(stored: &VersionIdentity) -> Self {
        match stored.legacy {
            Some(key) => CacheKeying::Legacy(key),
            None => CacheKeying::Identity(stored.teachers.clone()),
        }
    }
}

impl Model {
    /// `served`, loaded, its teachers not yet probed, keying its answers
    /// by `keying`.
    pub fn new(served: Served, keying: CacheKeying) -> Arc<Model> {
        let Served { name, version, dataset, ensemble, input, teachers_running } = served;
        let number = version.parse().unwrap_or(0);
        let tag = ModelTag { name: name.as_str().into(), version: version.into() };
        let (ready, loaded) = (false.into(), true.into());
        Arc::new(Model {
            name,
            ensemble,
            input,
            dataset,
            tag,
            number,
            keying,
            ready,
            loaded,
            stats: Statistics::default(),
            answers: OnceLock::new(),
            _teachers_running: teachers_running,
        })
    }

    /// Counts `n` answers it released in `metrics`.
    pub fn count_answers(&self, metrics: &ServiceMetrics, n: usize) {
        let answers = self.answers.get_or_init(|| metrics.model_answers(&self.name, self.version()));
        answers.inc_by(n as u64);
    }

    /// Its name and version, as the journal records them.
    pub fn tag(&self) -> &ModelTag {
        &self.tag
    }

    /// Its version.
    pub fn version(&self) -> &str {
        &self.tag.version
    }

    /// Whether the last probe found every one of its teachers ready.
    pub fn teachers_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Records a probe of its teachers.
    pub fn set_teachers_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Whether new requests may resolve to it.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::SeqCst)
    }

    /// The answer cache's digest of an input whose digest is `input`,
    /// asked of this model version.
    pub fn digest(&self, input: QueryDigest) -> QueryDigest {
        match &self.keying {
            CacheKeying::Identity(identity) => input.of_identity(&self.name, self.version(), identity),
            CacheKeying::Legacy(LegacyKey::InputOnly) => input,
            CacheKeying::Legacy(LegacyKey::NameAndVersion) => input.of_model(&self.name, self.version()),
        }
    }
}

/// Every model version; one model the default.
pub struct Models {
    /// The default model's name (what an empty model name means).
    default: String,
    /// Every version of every model, by name then version.
    all: Vec<Arc<Model>>,
}

impl Models {
    /// Every version in `all` (whose (name, version) pairs are distinct
    /// and whose versions are numbers: the settings checked), `default`
    /// the model an empty name means.
    pub fn new(default: String, mut all: Vec<Arc<Model>>) -> Self {
        // The default model first, then by name; versions in order.
        let key = |m: &Arc<Model>| (m.name != default, m.name.clone(), m.number);
        all.sort_by_key(key);
        Models { default, all }
    }

    /// The version `version` of `name`, if there is one.
    pub fn version(&self, name: &str, version: &str) -> Option<&Arc<Model>> {
        self.versions(name).iter().find(|m| m.version() == version)
    }

    /// Every model version, the default model's first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.all.iter()
    }

    /// The model a request's `name` means: the default one if it is empty.
    pub fn model_name<'a>(&'a self, name: &'a str) -> &'a str {
        if name.is_empty() { &self.default } else { name }
    }

    /// The model `name` (empty: the default one) at `version` that a new
    /// request is answered by: that version if it is loaded; for an empty
    /// version the newest loaded one whose teachers are ready, else the
    /// newest loaded one.
    ///
    /// # Errors
    /// [`ServiceError::NotFound`] for a name or version not served here,
    /// [`ServiceError::Unloaded`] for an unloaded version (or a model
    /// whose every version is unloaded).
    pub fn serving(&self, name: &str, version: &str) -> Result<&Arc<Model>, ServiceError> {
        let name = self.model_name(name);
        let model = self.named(name, version)?;
        if !version.is_empty() {
            return if model.loaded() { Ok(model) } else { Err(unloaded(name, Some(version))) };
        }
        let loaded = || self.versions(name).iter().filter(|m| m.loaded());
        loaded().rfind(|m| m.teachers_ready()).or_else(|| loaded().next_back()).ok_or_else(|| unloaded(name, None))
    }

    /// The model called `name` at `version` (empty: its newest), loaded
    /// or not, as the Open Inference Protocol's metadata and readiness
    /// calls name a model.
    ///
    /// # Errors
    /// [`ServiceError::NotFound`], listing what is served.
    pub fn named(&self, name: &str, version: &str) -> Result<&Arc<Model>, ServiceError> {
        let found = if version.is_empty() { self.versions(name).last() } else { self.version(name, version) };
        found.ok_or_else(|| self.not_found(name, version))
    }

    /// Every version of `name`, oldest first (they are next to each
    /// other: [`Models::new`] sorts by name).
    pub fn versions(&self, name: &str) -> &[Arc<Model>] {
        let start = self.all.iter().position(|m| m.name == name).unwrap_or(self.all.len());
        let len = self.all[start..].iter().take_while(|m| m.name == name).count();
        &self.all[start..start + len]
    }

    /// Loads (`loaded`) or unloads `version` (not empty) of `name`, or
    /// every version of it (`None`); the versions it changed.
    ///
    /// # Errors
    /// [`ServiceError::NotFound`] for a name or version not served here.
    pub fn set_loaded(
        &self,
        name: &str,
        version: Option<&str>,
        loaded: bool,
    ) -> Result<Vec<&Arc<Model>>, ServiceError> {
        let chosen: Vec<&Arc<Model>> = match version {
            None => self.versions(name).iter().collect(),
            Some(v) => vec![self.named(name, v)?],
        };
        if chosen.is_empty() {
            return Err(self.not_found(name, ""));
        }
        for model in &chosen {
            model.loaded.store(loaded, Ordering::SeqCst);
        }
        Ok(chosen)
    }

    /// Gives each version `old` also serves its load state there.
    pub fn keep_load_state(&self, old: &Models) {
        for model in &self.all {
            if let Some(before) = old.version(&model.name, model.version()) {
                model.loaded.store(before.loaded(), Ordering::SeqCst);
            }
        }
    }

    fn not_found(&self, name: &str, version: &str) -> ServiceError {
        let mut served: Vec<String> = Vec::new();
        for m in &self.all {
            match served.last_mut() {
                Some(last) if last.starts_with(&format!("{:?} ", m.name)) => {
                    last.push_str(&format!(", {:?}", m.version()))
                }
                _ => served.push(format!("{:?} (versions {:?}", m.name, m.version())),
            }
        }
        let served: Vec<String> = served.into_iter().map(|s| s + ")").collect();
        // The client's words are echoed, but never more than a name's length.
        let (name, version) = (clip(name), clip(version));
        ServiceError::NotFound(format!(
            "model {name:?} version {version:?} is not served here: this pacpriv serves {} (an empty version is the \
             newest; an empty model name is {:?})",
            served.join(", "),
            self.default
        ))
    }
}

/// The refusal of a request for an unloaded `version` of `name` (`None`:
/// every version is unloaded).
fn unloaded(name: &str, version: Option<&str>) -> ServiceError {
    let (name, which) = match version {
        Some(v) => (clip(name), format!("version {:?} of model", clip(v))),
        None => (clip(name), "every version of model".to_owned()),
    };
    ServiceError::Unloaded(format!(
        "{which} {name:?} is unloaded on this server: nothing was asked or charged; ask another version (an \
         empty version is the newest loaded one), or ask the operator to load it (RepositoryModelLoad on the \
         admin listener: pacpriv admin load {name})"
    ))
}

/// At most 64 characters of `s`: a model name or version a client sent,
/// as an error echoes it.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}
