//! A dataset's record: its sealed secret index and the teacher set it
//! belongs to. The default dataset's is where releases before datasets
//! kept the deployment's one record, so their stores open unchanged.

/// The dataset a store written before datasets holds (`[privacy]`'s):
/// its record and its sessions' keys are those releases'.
pub const DEFAULT_DATASET: &str = "default";

/// The store key of `principal`'s session in `dataset` (or of the shared
/// session, [`GLOBAL_SESSION`], under global scope): the name alone in
/// the default dataset, as before datasets; `dataset/name` in another
/// (neither principal names nor dataset names hold a `/`).
pub fn session_key(dataset: &str, principal: &str) -> String {
    if dataset == DEFAULT_DATASET { principal.to_owned() } else { format!("{dataset}/{principal}") }
}

/// The store key of the shared session under global scope in the default
/// dataset (which uses no per-principal keys, so no principal name can
/// collide with it: names cannot contain `*`).
pub const GLOBAL_SESSION: &str = "*global*";

/// A dataset's record.
#[derive(Clone, PartialEq, Eq)]
pub struct Meta {
    /// s*, sealed: only the service's `session` turns it into a `SecretIndex`.
    pub secret: usize,
    /// Describes the teacher set s* indexes into (m and model names).
    pub teachers: String,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("secret", &"<redacted>").field("teachers", &self.teachers).finish()
    }
}

/// A model version's stored identity in a dataset: which teachers (and
/// output) its number names (`ModelSettings::identity`), and how its
/// answers are keyed in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionIdentity {
    /// The digest of its teachers and output.
    pub teachers: String,
    /// `None`: its answers are cached under a key naming its identity.
    /// Otherwise the key of the releases before stored identities, so
    /// that the caches of a store they wrote carry over: set, once and for
    /// good, for the versions such a store's dataset was configured with
    /// when this release first started on it.
    pub legacy: Option<LegacyKey>,
}

/// How the releases before stored identities keyed a version's answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyKey {
    /// By the input alone: the default model's version 1.
    InputOnly,
    /// By the model's name and version: every other version.
    NameAndVersion,
}
