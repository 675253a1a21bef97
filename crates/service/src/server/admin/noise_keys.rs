//! `ExportNoiseKeys`: every dataset's noise key, for an auditor the data
//! owner trusts (`pacpriv admin export --noise-key`, then `pacpriv verify
//! --noise-key`). The key lets its holder recompute every release's draw,
//! and so tell s*: it leaves only through this call, behind the admin
//! token, and each call is logged at warning level — without the key.

use crate::proto::pacpriv::{DatasetNoiseKey, NoiseKeys};
use crate::server::App;

/// Every dataset's key and its commitment.
pub fn apply(app: &App) -> NoiseKeys {
    let keys: Vec<DatasetNoiseKey> = app
        .sessions
        .noise_keys()
        .map(|(dataset, key)| DatasetNoiseKey {
            dataset: dataset.to_owned(),
            key: key.expose().to_vec(),
            commitment: key.commitment().to_vec(),
        })
        .collect();
    let datasets: Vec<&str> = keys.iter().map(|k| k.dataset.as_str()).collect();
    tracing::warn!(
        ?datasets,
        "noise keys exported through the admin API: their holder can recompute every release's noise, and so tell \
         the secret index"
    );
    NoiseKeys { keys }
}
