//! Each model version's stored identity: what its number names in its
//! dataset ([`ModelSettings::identity`]: its output and its teachers),
//! claimed in the store by the first start or reload that serves it, and
//! how it keys its answers in the cache ([`CacheKeying`]).
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
//! - A reload claims a version before building it: a refused one starts
//!   nothing. (A start builds its teachers first, then opens the store.)
//! - The versions a store from a release before identities already
//!   served — every version configured at its dataset's first start of
//!   this release — keep that release's cache key, so the caches it wrote
//!   carry over; every other version keys its answers by its identity.

use crate::server::models::CacheKeying;
use crate::settings::{FIRST_VERSION, ModelSettings};
use crate::store::{Store, StoreError, VersionIdentity};

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
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Claims `model`'s identity in `dataset` (with the legacy cache key when
/// `legacy`: module documentation) and returns how it keys its answers;
/// `default` is the default model's name.
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
    let candidate = VersionIdentity { teachers: model.identity(), legacy_key: legacy };
    let stored = store.claim_version(&model.dataset, &model.name, &model.version, &candidate).await?;
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
    Ok(CacheKeying::of(&stored, &model.name, &model.version, default))
}

/// Whether `dataset`'s versions configured now keep the legacy cache key:
/// its record was in the store before this start (`existed`) but no
/// version's identity is — a store from a release before identities.
///
/// # Errors
/// The store's.
pub async fn upgraded(store: &Store, dataset: &str, existed: bool) -> Result<bool, StoreError> {
    Ok(existed && !store.has_versions(dataset).await?)
}
