//! The secret subset index s*: established once per dataset and sealed
//! in the store. On the dataset's first start it is read from the
//! operator's file or drawn uniformly from the OS CSPRNG, and written
//! (durably) before any of its sessions exists; every later start reads
//! it back. A start whose teacher set or operator-provided index
//! disagrees with the store refuses. Errors never contain the index.

use chacha20::ChaCha20Rng;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::mechanism::SecretIndex;
use pacpriv_store::{Meta, Store, StoreError};
use rand::rngs::SysRng;
use rand::{RngExt, SeedableRng, TryRng};
use std::path::Path;

/// Why no secret index could be established.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read secret index file {path}: {reason}")]
    Read {
        /// The configured path.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file does not hold an index below m (its content is not echoed).
    #[error("secret index file {path} must hold one decimal integer below the number of teachers ({m})")]
    Invalid {
        /// The configured path.
        path: String,
        /// Number of teachers.
        m: usize,
    },
    /// Another dataset of the store has this teacher set: the same subsets
    /// under two names would be two secrets and two budgets over one.
    #[error(
        "dataset {dataset:?}: its teacher set ({teachers}) is dataset {other:?}'s in this store. The same subsets \
         are one secret: models over them belong to one dataset, and a dataset keeps its name (a renamed one \
         would start every principal afresh)"
    )]
    SameTeachers {
        /// The dataset being established.
        dataset: String,
        /// The stored dataset with the same teacher set.
        other: String,
        /// The teacher set's description.
        teachers: String,
    },
    /// The store already holds sessions under a new dataset's key prefix:
    /// the default dataset's sessions of principals an earlier release let
    /// be named `DATASET/NAME`, whose posteriors are about another secret.
    #[error(
        "dataset {dataset:?} starts for the first time, but the store already holds {count} session(s) under its \
         key prefix \"{dataset}/\" (e.g. {example:?}): sessions of principals an earlier release let be named \
         \"{dataset}/NAME\", about another dataset's secret. This dataset's principals would resume them; name the \
         dataset otherwise"
    )]
    SessionsUnderPrefix {
        /// The dataset being established.
        dataset: String,
        /// How many sessions are under its prefix.
        count: usize,
        /// One of them.
        example: String,
    },
    /// The OS random source failed.
    #[error("the OS random source failed: {0}")]
    Entropy(String),
    /// The store refused (other teacher set, conflicting index, I/O).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `dataset`'s s* for `m` teachers described by `teachers`. `data`, when
/// known, is what every teacher set over the same subsets is described
/// as starting with (for the demo: its seed, which alone draws the
/// subsets); another dataset of the store whose teacher set starts so is
/// refused — one set of subsets would otherwise be two secrets with two
/// budgets (a renamed dataset, or one declared twice).
///
/// # Errors
/// [`SecretError`].
pub async fn establish(
    store: &Store,
    dataset: &str,
    file: Option<&Path>,
    m: usize,
    teachers: &str,
    data: Option<&str>,
) -> Result<SecretIndex, SecretError> {
    let provided = file.map(|f| read(f, m)).transpose()?;
    let shown = store.location();
    for (other, meta) in store.metas().await? {
        let same = meta.teachers == teachers || data.is_some_and(|d| meta.teachers.starts_with(d));
        if other != dataset && same {
            return Err(SecretError::SameTeachers {
                dataset: dataset.to_owned(),
                other,
                teachers: teachers.to_owned(),
            });
        }
    }
    let meta = match store.meta(dataset).await? {
        Some(meta) => meta,
        None => {
            if dataset != pacpriv_store::DEFAULT_DATASET {
                let prefix = format!("{dataset}/");
                let under: Vec<String> =
                    store.sessions().await?.into_iter().filter(|s| s.starts_with(&prefix)).collect();
                if let Some(example) = under.first() {
                    return Err(SecretError::SessionsUnderPrefix {
                        dataset: dataset.to_owned(),
                        count: under.len(),
                        example: example.clone(),
                    });
                }
            }
            let candidate = match provided {
                Some(p) => p,
                None => draw(m)?,
            };
            // With replicas starting together the first writer wins and
            // everyone adopts its index; a candidate that lost was never used.
            let meta = store.init_meta(dataset, &Meta { secret: candidate, teachers: teachers.to_owned() }).await?;
            // Loud on purpose: a server that answered before but now finds an
            // empty store (another working directory, a lost volume) would
            // hand every principal a fresh budget over the same teachers.
            tracing::warn!(
                store = %shown,
                dataset,
                secret = if provided.is_some() { "from privacy.secret_index_file" } else { "drawn from the OS CSPRNG" },
                "new store (or a new dataset in it): no sessions yet, every principal starts with its full budget; \
                 if this deployment has answered queries about this dataset before, stop it — its store is \
                 elsewhere (store.path is relative to the working directory)"
            );
            meta
        }
    };
    if meta.teachers != teachers {
        return Err(StoreError::TeacherSetChanged {
            path: shown,
            stored: meta.teachers,
            configured: teachers.to_owned(),
        }
        .into());
    }
    if provided.is_some_and(|p| p != meta.secret) {
        return Err(StoreError::SecretConflict { path: shown }.into());
    }
    SecretIndex::new(meta.secret, m).map_err(|_| SecretError::Invalid { path: shown, m })
}

/// `dataset`'s noise key ([`NoiseKey`]): on its first start (or the first
/// start of a release with keys, for a dataset created before them) 256
/// bits from the OS CSPRNG, written durably before any draw uses them;
/// every later start, and every other replica, reads the stored one. Its
/// commitment (public) is logged when it is created; the key never is.
///
/// # Errors
/// [`SecretError`]: the OS random source or the store failed.
pub async fn establish_noise_key(store: &Store, dataset: &str) -> Result<NoiseKey, SecretError> {
    let mut candidate = [0u8; 32];
    SysRng.try_fill_bytes(&mut candidate).map_err(|e| SecretError::Entropy(e.to_string()))?;
    let stored = NoiseKey::from_bytes(store.init_noise_key(dataset, &candidate).await?);
    if stored.expose() == &candidate {
        tracing::info!(
            dataset,
            commitment = %super::hex(&stored.commitment()),
            "new noise key for this dataset (committed in every journaled step; `pacpriv admin export --noise-key` \
             hands it to an auditor)"
        );
    }
    Ok(stored)
}

fn draw(m: usize) -> Result<usize, SecretError> {
    let mut rng = ChaCha20Rng::try_from_rng(&mut SysRng).map_err(|e| SecretError::Entropy(e.to_string()))?;
    Ok(rng.random_range(0..m))
}

/// The index held in an operator's secret index file (one decimal integer
/// below `m`). Also read by `pacpriv audit`, which scores its adversary
/// against the truth; the error never echoes the file's content.
///
/// # Errors
/// [`SecretError::Read`] or [`SecretError::Invalid`].
pub fn read(path: &Path, m: usize) -> Result<usize, SecretError> {
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| SecretError::Read { path: shown.clone(), reason: e.to_string() })?;
    match text.trim().parse::<usize>() {
        Ok(i) if i < m => Ok(i),
        _ => Err(SecretError::Invalid { path: shown, m }),
    }
}

#[cfg(test)]
mod test {
    use super::*;

    use pacpriv_store::{DEFAULT_DATASET, EmbeddedStore};
    use std::sync::Arc;

    fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store::Embedded(Arc::new(EmbeddedStore::open(path)?)))
    }

    #[tokio::test]
    async fn drawn_once_then_kept_and_conflicts_refuse() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.redb");
        let first = {
            let store = open(&path)?;
            establish(&store, DEFAULT_DATASET, None, 64, "demo m=64", None).await?
        };
        let store = open(&path)?;
        assert_eq!(establish(&store, DEFAULT_DATASET, None, 64, "demo m=64", None).await?, first, "a restart keeps s*");
        let other = establish(&store, DEFAULT_DATASET, None, 64, "demo m=32", None).await;
        assert!(matches!(other, Err(SecretError::Store(StoreError::TeacherSetChanged { .. }))));

        let file = dir.path().join("secret");
        std::fs::write(&file, format!("{}\n", (first.expose() + 1) % 64))?;
        let conflict = establish(&store, DEFAULT_DATASET, Some(&file), 64, "demo m=64", None).await;
        assert!(matches!(conflict, Err(SecretError::Store(StoreError::SecretConflict { .. }))));
        std::fs::write(&file, format!("{}", first.expose()))?;
        assert_eq!(establish(&store, DEFAULT_DATASET, Some(&file), 64, "demo m=64", None).await?, first);
        Ok(())
    }

    /// Issue 67 §2: a dataset whose first start finds sessions under its
    /// prefix (a principal an earlier release let be named `fashion/alice`)
    /// refuses, naming one, instead of letting its principals resume them.
    #[tokio::test]
    async fn a_new_dataset_refuses_sessions_already_under_its_prefix() -> Result<(), Box<dyn std::error::Error>> {
        use pacpriv_privacy::posterior::Form;
        use pacpriv_store::{Change, SessionRecord};
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.redb");
        {
            let store = EmbeddedStore::open(&path)?;
            let record = SessionRecord {
                version: 10,
                posterior: Form::Log(vec![0.0; 8]),
                spent: 0.1,
                limit: 1.0,
                answered: 10,
                charged: 10,
                cache: None,
                cache_owners: Vec::new(),
                journal_head: None,
                journal_events: 0,
                dataset: None,
            };
            store.enqueue("fashion/alice", record, Change::default())?.durable().await?;
        }
        let store = open(&path)?;
        establish(&store, DEFAULT_DATASET, None, 8, "t8", None).await?;
        match establish(&store, "fashion", None, 8, "f8", None).await {
            Err(e @ SecretError::SessionsUnderPrefix { .. }) => {
                let e = e.to_string();
                assert!(e.contains("\"fashion/alice\"") && e.contains("name the dataset otherwise"), "{e}");
            }
            other => panic!("{:?}", other.map(|s| s.expose())),
        }
        assert!(store.meta("fashion").await?.is_none(), "nothing was established");
        establish(&store, "garden", None, 8, "g8", None).await?;
        Ok(())
    }

    #[tokio::test]
    async fn operator_file_is_used_on_first_start_and_validated() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = open(&dir.path().join("s.redb"))?;
        let file = dir.path().join("secret");
        std::fs::write(&file, "99")?;
        let e = establish(&store, DEFAULT_DATASET, Some(&file), 8, "t", None)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("below the number of teachers (8)") && !e.contains("99"), "{e}");
        std::fs::write(&file, "3")?;
        assert_eq!(establish(&store, DEFAULT_DATASET, Some(&file), 8, "t", None).await?.expose(), 3);
        Ok(())
    }

    #[tokio::test]
    async fn each_dataset_keeps_its_own_secret_and_teacher_set() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("s.redb");
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "3")?;
        std::fs::write(&b, "5")?;
        {
            let store = open(&path)?;
            assert_eq!(establish(&store, DEFAULT_DATASET, Some(&a), 8, "t8", None).await?.expose(), 3);
            assert_eq!(establish(&store, "other", Some(&b), 16, "u16", None).await?.expose(), 5);
        }
        let store = open(&path)?;
        assert_eq!(
            establish(&store, DEFAULT_DATASET, None, 8, "t8", None).await?.expose(),
            3,
            "a restart keeps each s*"
        );
        assert_eq!(establish(&store, "other", None, 16, "u16", None).await?.expose(), 5);
        // Each dataset its own noise key, kept across restarts.
        let (k1, k2) =
            (establish_noise_key(&store, DEFAULT_DATASET).await?, establish_noise_key(&store, "other").await?);
        assert_ne!(k1, k2);
        drop(store);
        let store = open(&path)?;
        assert_eq!(establish_noise_key(&store, DEFAULT_DATASET).await?, k1, "a restart keeps the noise key");
        assert_eq!(establish_noise_key(&store, "other").await?, k2);
        let swapped = establish(&store, "other", None, 16, "u32", None).await;
        assert!(matches!(swapped, Err(SecretError::Store(StoreError::TeacherSetChanged { .. }))));
        // The default dataset's teachers under another name: refused, not
        // a second secret over them.
        let renamed = establish(&store, "renamed", None, 8, "t8", None).await;
        assert!(
            matches!(renamed, Err(SecretError::SameTeachers { ref other, .. }) if other == "default"),
            "{renamed:?}"
        );
        Ok(())
    }
}
