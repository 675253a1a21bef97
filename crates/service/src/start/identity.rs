//! Each model version's stored identity: what its number names in its
//! dataset ([`ModelSettings::identity`]: its output and its teachers),
//! claimed in the store by the first start or reload that gets as far as
//! serving it, and how it keys its answers in the cache ([`CacheKeying`]).
//!
//! A version number reused for other teachers — changed in place by a
//! reload, removed and added again, or a changed default model — would
//! otherwise serve its predecessor's cached answers (charged, so nothing
//! leaks, but another model's, and of another shape if its output
//! changed), and a reordered `teachers.remote` would break "teacher i on
//! subset i" unnoticed. So the store keeps every version's identity, and a
//! start or reload giving a claimed number other teachers is refused.
//!
//! # Invariants
//! - A (dataset, model, version) has one identity, the first claim's, for
//!   the store's life: a version removed from the configuration keeps
//!   its number's claim.
//! - A claim is made once everything else about the version has been
//!   checked and built: its teachers started, the file descriptors they
//!   need (a start also provisions the principals first).
//! - A dataset an earlier release created is not keyed by identity
//!   ([`Store::identity_keyed`]): the versions its first start under this
//!   release configures are claimed with that release's cache key
//!   ([`LegacyKey`]), kept for good, so the caches it wrote carry over;
//!   then the dataset is marked, and every later version keys its answers
//!   by its identity. A dataset this release creates is marked with its
//!   record, in one write.

use crate::server::models::CacheKeying;
use crate::settings::{FIRST_VERSION, ModelSettings};
use pacpriv_store::{LegacyKey, Store, StoreError, VersionIdentity};

/// Why a model version's identity could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The store knows this version number as other teachers.
    #[error(
        "model {model:?} version {version} (dataset {dataset:?}): this store knows version {version} as other \
         teachers (or another output) than the configuration now gives it, and its cached answers are theirs. {fix}"
    )]
    Reused {
        /// Its dataset.
        dataset: String,
        /// Its model.
        model: String,
        /// Its version.
        version: String,
        /// What the operator does about it.
        fix: String,
    },
    /// The store failed.
    #[error("model {model:?} version {version}: claiming its identity: {source}")]
    Store {
        /// Its model.
        model: String,
        /// Its version.
        version: String,
        /// The store's error.
        source: StoreError,
    },
}

/// Claims `model`'s identity in its dataset and returns how it keys its
/// answers. `legacy`: its dataset is not keyed by identity yet (module
/// documentation), so a new claim keeps the earlier releases' key —
/// the input alone for the default model's (`default`'s) version 1.
///
/// # Errors
/// [`IdentityError::Reused`] when the store holds another identity for
/// its number; the store's errors.
pub async fn claim(
    store: &Store,
    model: &ModelSettings,
    legacy: bool,
    default: &str,
) -> Result<CacheKeying, IdentityError> {
    let legacy = legacy.then(|| {
        if model.name == default && model.version == FIRST_VERSION {
            LegacyKey::InputOnly
        } else {
            LegacyKey::NameAndVersion
        }
    });
    let candidate = VersionIdentity { teachers: model.identity(), legacy };
    let stored = store
        .claim_version(&model.dataset, &model.name, &model.version, &candidate)
        .await
        .map_err(|source| IdentityError::Store { model: model.name.clone(), version: model.version.clone(), source })?;
    if stored.teachers != candidate.teachers {
        let fix = if model.version == FIRST_VERSION {
            format!(
                "Version 1 is the model's own tables: restore its teachers there, and give the new ones a new \
                 version number ([versions.{}.N], N not used before in this store)",
                model.name
            )
        } else {
            format!(
                "Give these teachers a version number not used before in this store ([versions.{}.N]), or restore \
                 version {}'s",
                model.name, model.version
            )
        };
        return Err(IdentityError::Reused {
            dataset: model.dataset.clone(),
            model: model.name.clone(),
            version: model.version.clone(),
            fix,
        });
    }
    Ok(CacheKeying::of(&stored))
}
