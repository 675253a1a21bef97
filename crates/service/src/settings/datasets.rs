//! `[datasets.<name>]`: more datasets besides the default one
//! (`[privacy]`'s, named `default`). A dataset is a secret space — m
//! subsets of one training set and the secret index s* over them — with
//! its privacy parameters; every model names the dataset its teachers
//! were trained on, and each (principal, dataset) has one session
//! (`docs/assurance/accounting.md` §10).
//!
//! A dataset's table holds keys of `[privacy]`; what it leaves out is
//! `[privacy]`'s value, except `secret_index_file`: s* is per dataset, so
//! a dataset without its own file draws its own. Its errors name the key
//! under `datasets.<name>.`.

use super::models::valid_name;
use super::parse::{SettingsError, err, overlay};
use super::privacy::{DatasetSettings, RawPrivacy};
use config::{Config, Value};
use pacpriv_store::DEFAULT_DATASET;
use std::collections::BTreeMap;

/// The most datasets besides the default one.
const MAX_MORE_DATASETS: usize = 15;

/// `[datasets.<name>]` as written: keys of `[privacy]`.
pub(super) type RawDataset = BTreeMap<String, Value>;

/// Every `[datasets.<name>]` of `config` (the merged configuration), in
/// name order, validated as `[privacy]` is.
///
/// # Errors
/// The first problem, naming its key under `datasets.<name>.`.
pub(super) fn more_datasets(
    config: &Config,
    raw: BTreeMap<String, RawDataset>,
) -> Result<Vec<DatasetSettings>, SettingsError> {
    if raw.len() > MAX_MORE_DATASETS {
        return Err(err("datasets", format!("at most {MAX_MORE_DATASETS} datasets besides the default one")));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (name, mut own) in raw {
        let key = format!("datasets.{name}");
        if !valid_name(&name) || name == DEFAULT_DATASET {
            return Err(err(
                &key,
                format!(
                    "a dataset name is 1 to 64 lower-case letters, digits, '_', '.' or '-', other than \
                     {DEFAULT_DATASET:?} ([privacy] is the default dataset's)"
                ),
            ));
        }
        own.entry("secret_index_file".to_owned()).or_insert_with(|| Value::from(""));
        let privacy: RawPrivacy = overlay(config, "privacy", own, &key)?;
        out.push(privacy.validate(&name, &key)?);
    }
    Ok(out)
}

/// Where dataset `name`'s keys are written: `privacy` for the default
/// dataset, `datasets.NAME` for another.
pub(super) fn section_of(name: &str) -> String {
    if name == DEFAULT_DATASET { "privacy".to_owned() } else { format!("datasets.{name}") }
}

/// No two `datasets` read their secret index from one file: the secrets
/// would be equal, not independent, and answers of one dataset would tell
/// about the other's (accounting §10).
///
/// # Errors
/// The second dataset's `secret_index_file`.
pub(super) fn distinct_secrets(datasets: &[DatasetSettings]) -> Result<(), SettingsError> {
    let file = |d: &DatasetSettings| {
        d.secret_index_file.as_ref().map(|f| std::fs::canonicalize(f).unwrap_or_else(|_| f.clone()))
    };
    for (i, dataset) in datasets.iter().enumerate() {
        let Some(mine) = file(dataset) else { continue };
        if let Some(earlier) = datasets[..i].iter().find(|d| file(d).as_ref() == Some(&mine)) {
            let key = |d: &DatasetSettings| section_of(&d.name);
            return Err(err(
                &format!("{}.secret_index_file", key(dataset)),
                format!(
                    "the file of {}.secret_index_file: two datasets are two independent secrets, each from its own \
                     file (or drawn)",
                    key(earlier)
                ),
            ));
        }
    }
    Ok(())
}
