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

use super::parse::{SettingsError, err, key_of};
use super::teachers::{RawDemo, RawModel, RawTeachers, TeacherSource};
use crate::teachers::{Batching, CallPolicy, OutputMode, Teachers};
use config::builder::DefaultState;
use config::{Config, ConfigBuilder, Value, ValueKind};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The most models one server answers for besides the default one
/// (each has its teachers' connections, and a label in the metrics).
pub const MAX_MORE_MODELS: usize = 15;

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

/// A model's sections: the top-level ones with its own keys over them.
#[derive(Deserialize)]
struct Sections {
    model: RawModel,
    teachers: RawTeachers,
    demo: RawDemo,
}

/// The default model `name` and the top-level sections' probe interval.
pub(super) struct Base<'a> {
    pub(super) model: &'a ModelSettings,
    pub(super) health_interval: Duration,
}

/// Every `[models.<name>]` of `config` (the merged configuration), in
/// name order, validated as the top-level sections are, and against the
/// default model: a distinct name, the same m, and — when both are demo
/// teachers — the same data and subsets (`demo.seed`, `demo.canaries`).
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
            return Err(err(&format!("models.{name}"), "a model name is 1 to 64 letters, digits, '_', '.' or '-'"));
        }
        if name == default.model.name {
            return Err(err(
                &format!("models.{name}"),
                "the default model (server.inference_model, or \"private\" when it is empty) already has this name",
            ));
        }
        let sections =
            sections(config, tables).map_err(|e| err(&format!("models.{name}.{}", key_of(&e)), e.to_string()))?;
        let (mode, input_shape) = sections.model.validate().map_err(within)?;
        let fanout = sections.teachers.validate(sections.demo).map_err(within)?;
        let model = ModelSettings {
            name: name.clone(),
            mode,
            input_shape,
            teachers: fanout.teachers,
            call: fanout.call,
            batching: fanout.batching,
        };
        same_data(&model, default.model)?;
        if fanout.health_interval != default.health_interval {
            return Err(err(
                &format!("models.{name}.teachers.health_interval_ms"),
                "every model's teachers are probed together, every teachers.health_interval_ms: set it there",
            ));
        }
        out.push(model);
    }
    Ok(out)
}

/// `model` is over the default model's data: the same m, and demo teachers
/// of the same split and subsets on a listener of their own.
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
    Ok(())
}

/// The top-level `model`, `teachers` and `demo` sections of `config` with
/// `tables` over them, key by key (a table within, such as
/// `teachers.stacked`, key by key too; a list, such as `teachers.remote`,
/// whole).
fn sections(config: &Config, tables: RawMoreModel) -> Result<Sections, config::ConfigError> {
    let mut builder = Config::builder().add_source(config.clone());
    for (section, table) in [("model", tables.model), ("teachers", tables.teachers), ("demo", tables.demo)] {
        builder = overlay(builder, section, table)?;
    }
    builder.build()?.try_deserialize()
}

fn overlay(
    mut builder: ConfigBuilder<DefaultState>,
    path: &str,
    table: impl IntoIterator<Item = (String, Value)>,
) -> Result<ConfigBuilder<DefaultState>, config::ConfigError> {
    for (key, value) in table {
        let path = format!("{path}.{key}");
        builder = match value.kind {
            ValueKind::Table(inner) => overlay(builder, &path, inner)?,
            _ => builder.set_override(path, value)?,
        };
    }
    Ok(builder)
}

/// What a model may be called: as principals may (a path segment of the
/// HTTP binding, a label value of the metrics).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}
