//! `[versions.<name>.<V>]`: more versions of a model — the default one or
//! a `[models.<name>]` — beside version 1, which is the model's own
//! tables. A version is the same model retrained: its teachers (and for
//! the demo, its fit) differ, nothing else does — the dataset, the input
//! shape and the output are the model's, as in Triton, where every
//! version of a model shares its configuration. So a version steps the
//! same sessions as every model of its dataset (`docs/assurance/accounting.md`
//! §10), and a client moving from version 1 to 2 keeps its posterior and
//! its spending.
//!
//! A version's table holds `teachers` and `demo` tables: each key over
//! the model's own value (its `[models.<name>]` key, else the top-level
//! section's). V is a whole number from 2 up; the Open Inference
//! Protocol's empty version is the newest ready one.
//!
//! # Invariants
//! - Every version has its dataset's m teachers from the same data
//!   (`models::same_data`), and teachers no other model or version has
//!   (`models::distinct`), so its answers are another mechanism of the
//!   same secret and its cache keys its own.
//! - Versions come after every model's version 1 in
//!   [`super::Settings::models`], so a dataset's first model — whose
//!   teachers name its secret in the store — is a version 1.

use super::ModelSettings;
use super::models::{FIRST_VERSION, RawMoreModel, distinct, same_data};
use super::parse::{SettingsError, err, overlay};
use super::teachers::{RawDemo, RawTeachers, TeacherSource};
use config::{Config, Value};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The most versions, in all, besides every model's version 1.
const MAX_VERSIONS: usize = 15;

/// The highest version number (Triton's versions are positive integers).
const MAX_VERSION: u32 = 999_999;

/// `[versions.<name>.<V>]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVersion {
    #[serde(default)]
    teachers: BTreeMap<String, Value>,
    #[serde(default)]
    demo: BTreeMap<String, Value>,
}

/// What versions are versions of.
pub(super) struct Bases<'a> {
    /// The default model (its tables are the top-level sections).
    pub(super) default: &'a ModelSettings,
    /// `[models.<name>]` as written: a version's keys go over these.
    pub(super) tables: &'a BTreeMap<String, RawMoreModel>,
    /// `teachers.health_interval_ms`: every model's teachers are probed
    /// together.
    pub(super) health_interval: Duration,
}

/// Every `[versions.<name>.<V>]`, by name then version number, checked
/// against the models (`more`: every `[models.<name>]` and the demo's
/// naive Bayes model) and each other.
///
/// # Errors
/// The first problem, naming its key under `versions.<name>.<V>`.
pub(super) fn versions(
    config: &Config,
    raw: BTreeMap<String, BTreeMap<String, RawVersion>>,
    bases: Bases<'_>,
    more: &[ModelSettings],
) -> Result<Vec<ModelSettings>, SettingsError> {
    let models = || std::iter::once(bases.default).chain(more);
    let count: usize = raw.values().map(BTreeMap::len).sum();
    if count > MAX_VERSIONS {
        return Err(err("versions", format!("at most {MAX_VERSIONS} versions besides every model's version 1")));
    }
    let mut out: Vec<ModelSettings> = Vec::with_capacity(count);
    for (name, versions) in raw {
        let Some(base) = models().find(|m| m.name == name) else {
            let names: Vec<&str> = models().map(|m| m.name.as_str()).collect();
            return Err(err(
                &format!("versions.{name}"),
                format!("no model {name:?}: a version is of a model, and the models are {names:?}"),
            ));
        };
        // The default model's tables are the top-level sections; a
        // `[models.<name>]`'s are its own; the demo's naive Bayes model
        // has none (it is the default's teachers refitted).
        let own = if name == bases.default.name {
            Some((BTreeMap::new(), BTreeMap::new()))
        } else {
            bases.tables.get(&name).map(|t| (t.teachers.clone(), t.demo.clone()))
        };
        let Some((own_teachers, own_demo)) = own else {
            return Err(err(
                &format!("versions.{name}"),
                "the demo's naive Bayes model (demo.naive_bayes_model) has one version: declare a [models.NAME] \
                 with demo.learner = \"naive_bayes\" to give one more",
            ));
        };
        let mut numbered = Vec::with_capacity(versions.len());
        for (version, tables) in versions {
            let key = |k: &str| format!("versions.{name}.{version}.{k}");
            let number = number(&version).ok_or_else(|| {
                err(
                    &format!("versions.{name}.{version}"),
                    format!(
                        "a version is a whole number from 2 to {MAX_VERSION}, written without leading zeros \
                         (version {FIRST_VERSION} is the model's own tables)"
                    ),
                )
            })?;
            let has_demo = !tables.demo.is_empty();
            let mut teachers = own_teachers.clone();
            teachers.extend(tables.teachers);
            let mut demo = own_demo.clone();
            demo.extend(tables.demo);
            let teachers: RawTeachers = overlay(config, "teachers", teachers, &key("teachers"))?;
            let demo: RawDemo = overlay(config, "demo", demo, &key("demo"))?;
            let within = |e: SettingsError| SettingsError { key: key(&e.key), ..e };
            let fanout = teachers.validate(demo).map_err(within)?;
            if fanout.health_interval != bases.health_interval {
                return Err(err(
                    &key("teachers.health_interval_ms"),
                    "every model's teachers are probed together, every teachers.health_interval_ms: set it there",
                ));
            }
            if has_demo && !matches!(fanout.teachers, TeacherSource::Demo { .. }) {
                return Err(err(&key("demo"), "only demo teachers read it, and this version's teachers are remote"));
            }
            let model = ModelSettings {
                version: version.clone(),
                teachers: fanout.teachers,
                call: fanout.call,
                batching: fanout.batching,
                ..base.clone()
            };
            let rename = |e: SettingsError| SettingsError {
                key: e.key.replacen(&format!("models.{name}."), &format!("versions.{name}.{version}."), 1),
                ..e
            };
            let first = models().find(|m| m.dataset == model.dataset).unwrap_or(base);
            same_data(&model, first).map_err(rename)?;
            for other in models().chain(&out).chain(numbered.iter().map(|(_, m)| m)) {
                distinct(&model, other).map_err(|e| {
                    let e = rename(e);
                    SettingsError { message: format!("{} (its version {})", e.message, other.version), ..e }
                })?;
            }
            numbered.push((number, model));
        }
        numbered.sort_by_key(|(n, _)| *n);
        out.extend(numbered.into_iter().map(|(_, m)| m));
    }
    Ok(out)
}

/// `version` as a number, if it is one from 2 to [`MAX_VERSION`] in
/// canonical form (so that "2" and "02" are not two versions).
fn number(version: &str) -> Option<u32> {
    let n: u32 = version.parse().ok()?;
    (n.to_string() == version && (2..=MAX_VERSION).contains(&n)).then_some(n)
}
