//! `[models.<name>]`: more models over the same data as the default one
//! (`[model]` and `[teachers]`, named by `server.inference_model`). Each
//! has its own teachers, teacher i trained on subset i of the same m
//! subsets, so every model's answers step the same sessions: one
//! posterior and one ledger per principal, whichever model answers
//! (`docs/assurance/accounting.md` §10).
//!
//! A model's table holds `model`, `teachers` and `demo` tables of the
//! top-level sections' keys; what it leaves out is the top-level
//! sections' value (after the operator's file and the environment), so a
//! model says only how it differs. Its errors name the key under
//! `models.<name>.`.

use super::parse::{SettingsError, err};
use super::teachers::{RawDemo, RawModel, RawTeachers, TeacherSource};
use crate::teachers::{Batching, CallPolicy, OutputMode, Teachers};
use config::{Config, Value, ValueKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The most models one server answers for besides the default one
/// (each holds its teachers' connections, and trains its demo teachers at start).
const MAX_MORE_MODELS: usize = 15;

/// The default model's name when `server.inference_model` is empty (the
/// Open Inference Protocol is then not served, but `Predict` still
/// names models).
pub const DEFAULT_MODEL: &str = "private";

/// One model: what its teachers answer (label or vector, d), the shape of
/// its input, and its teachers.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSettings {
    /// Its name on the wire (`PredictRequest.model`, the Open Inference
    /// Protocol's model name).
    pub name: String,
    /// How teacher outputs are read (label or vector, d).
    pub mode: OutputMode,
    /// Shape of one example.
    pub input_shape: Vec<usize>,
    /// Its m teachers.
    pub teachers: TeacherSource,
    /// Per-teacher call policy.
    pub call: CallPolicy,
    /// Dynamic batching of its fan-out.
    pub batching: Batching,
}

/// `[models.<name>]` as written: each table holds keys of the top-level
/// section of that name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMoreModel {
    #[serde(default)]
    model: BTreeMap<String, Value>,
    #[serde(default)]
    teachers: BTreeMap<String, Value>,
    #[serde(default)]
    demo: BTreeMap<String, Value>,
}

/// What the models are checked against: the default model, and the
/// top-level sections' probe interval.
pub(super) struct Base<'a> {
    pub(super) model: &'a ModelSettings,
    pub(super) health_interval: Duration,
}

/// Every `[models.<name>]` of `config` (the merged configuration), in
/// name order, validated as the top-level sections are, and against the
/// default model ([`same_data`]).
///
/// # Errors
/// The first problem, naming its key under `models.<name>.`.
pub(super) fn more_models(
    config: &Config,
    raw: BTreeMap<String, RawMoreModel>,
    default: Base<'_>,
) -> Result<Vec<ModelSettings>, SettingsError> {
    if raw.len() > MAX_MORE_MODELS {
        return Err(err("models", format!("at most {MAX_MORE_MODELS} models besides the default one")));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (name, tables) in raw {
        let within = |e: SettingsError| SettingsError { key: format!("models.{name}.{}", e.key), ..e };
        if !valid_name(&name) {
            return Err(err(
                &format!("models.{name}"),
                "a model name is 1 to 64 lower-case letters, digits, '_', '.' or '-' (lower-case, so that \
                 PACPRIV__MODELS__NAME__… variables reach it)",
            ));
        }
        if name == default.model.name {
            return Err(err(
                &format!("models.{name}"),
                "the default model (server.inference_model, or \"private\" when it is empty) already has this name",
            ));
        }
        let own_demo = !tables.demo.is_empty();
        let model: RawModel = section(config, &name, "model", tables.model)?;
        let teachers: RawTeachers = section(config, &name, "teachers", tables.teachers)?;
        let demo: RawDemo = section(config, &name, "demo", tables.demo)?;
        let (mode, input_shape) = model.validate().map_err(within)?;
        let fanout = teachers.validate(demo).map_err(within)?;
        if fanout.health_interval != default.health_interval {
            return Err(err(
                &format!("models.{name}.teachers.health_interval_ms"),
                "every model's teachers are probed together, every teachers.health_interval_ms: set it there",
            ));
        }
        let model = ModelSettings {
            name: name.clone(),
            mode,
            input_shape,
            teachers: fanout.teachers,
            call: fanout.call,
            batching: fanout.batching,
        };
        if own_demo && !matches!(model.teachers, TeacherSource::Demo { .. }) {
            return Err(err(
                &format!("models.{name}.demo"),
                "only demo teachers read it, and this model's teachers are remote (teachers.source)",
            ));
        }
        same_data(&model, default.model)?;
        out.push(model);
    }
    Ok(out)
}

/// `model` is over the default model's data, as far as the configuration
/// can tell: the same m; teachers from the same source (the demo's data is
/// not the operator's); for demo teachers the same split and subsets
/// (`demo.seed`, `demo.canaries`), on a listener of their own; and not the
/// default's very teachers under another name. That teacher i of a remote
/// model was trained on subset i is the operator's declaration (P7).
fn same_data(model: &ModelSettings, default: &ModelSettings) -> Result<(), SettingsError> {
    let key = |k: &str| format!("models.{}.{k}", model.name);
    let (m, m0) = (model.teachers.m(), default.teachers.m());
    if m != m0 {
        let counted = match &model.teachers {
            TeacherSource::Demo { .. } => "demo.models",
            TeacherSource::Remote(Teachers::PerTeacher(_)) => "teachers.remote",
            TeacherSource::Remote(Teachers::Stacked { .. }) => "teachers.stacked.models",
        };
        return Err(err(
            &key(counted),
            format!(
                "{m} teachers, but the default model has m = {m0}: every model over the same data has one teacher \
                 per subset, teacher i trained on subset i"
            ),
        ));
    }
    if matches!(model.teachers, TeacherSource::Demo { .. }) != matches!(default.teachers, TeacherSource::Demo { .. }) {
        return Err(err(
            &key("teachers.source"),
            "the demo teachers are trained on the demo data and remote ones on yours: a model's teachers are \
             over the same data as the default model's only if they come from the same source",
        ));
    }
    if let (
        TeacherSource::Demo { seed, canaries, listen, .. },
        TeacherSource::Demo { seed: seed0, canaries: canaries0, listen: listen0, .. },
    ) = (&model.teachers, &default.teachers)
    {
        if seed != seed0 || canaries != canaries0 {
            return Err(err(
                &key("demo"),
                "seed and canaries must be the default model's (demo.seed, demo.canaries): they choose the data \
                 and its subsets, which every model shares",
            ));
        }
        if listen.port() != 0 && listen == listen0 {
            return Err(err(
                &key("demo.listen"),
                format!("{listen} is the default model's demo.listen: use another port, or 0"),
            ));
        }
    }
    if teachers_of(&model.teachers) == teachers_of(&default.teachers) {
        return Err(err(
            &key("teachers"),
            "the same teachers as the default model: give this model its own (teachers.remote, \
             teachers.stacked, or for the demo demo.regularisation)",
        ));
    }
    Ok(())
}

/// The top-level section `section` of `config` with `own` over it, key by
/// key, for the model `model`. A key's value is replaced whole: a list
/// such as `teachers.remote`, and a table such as `teachers.stacked` too —
/// so that a model's own endpoint never inherits the default's
/// credentials (its headers, client certificate, CA).
fn section<T: serde::de::DeserializeOwned>(
    config: &Config,
    model: &str,
    section: &str,
    own: BTreeMap<String, Value>,
) -> Result<T, SettingsError> {
    let key = format!("models.{model}.{section}");
    let mut table = config.get_table(section).map_err(|e| err(&key, e.to_string()))?;
    table.extend(own);
    Value::new(None, ValueKind::Table(table)).try_deserialize().map_err(|e| err(&key, e.to_string()))
}

/// Which teachers `source` names: the demo's fit (its data is checked
/// apart), or each remote model's endpoint, name and version.
fn teachers_of(source: &TeacherSource) -> Vec<String> {
    match source {
        TeacherSource::Demo { regularisation, .. } => vec![format!("demo regularisation={regularisation}")],
        TeacherSource::Remote(Teachers::PerTeacher(specs)) => {
            specs.iter().map(|t| format!("{} {}@{}", t.endpoint, t.model, t.version)).collect()
        }
        TeacherSource::Remote(Teachers::Stacked { spec, .. }) => {
            vec![format!("stacked {} {}@{}", spec.endpoint, spec.model, spec.version)]
        }
    }
}

/// What a model may be called: as principals may (a path segment of the
/// HTTP binding), but in lower case, as the environment's keys arrive.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
}
