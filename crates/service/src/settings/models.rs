//! `[models.<name>]`: more models besides the default one (`[model]` and
//! `[teachers]`, named by `server.inference_model`), each over a dataset
//! (`dataset`, the default one's when left out). Each has its own
//! teachers, teacher i trained on subset i of its dataset's m subsets, so
//! every model of a dataset steps the same sessions: one posterior and
//! one ledger per (principal, dataset), whichever model answers
//! (`docs/assurance/accounting.md` §10).
//!
//! A model's table holds `model`, `teachers` and `demo` tables of the
//! top-level sections' keys; what it leaves out is the top-level
//! sections' value (after the operator's file and the environment), so a
//! model says only how it differs. Its errors name the key under
//! `models.<name>.`.

use super::parse::{SettingsError, err, overlay};
use super::privacy::DatasetSettings;
use super::teachers::{DemoLearner, RawDemo, RawModel, RawTeachers, TeacherSource};
use crate::teachers::{Batching, CallPolicy, OutputMode, Teachers};
use config::{Config, Value};
use pacpriv_store::DEFAULT_DATASET;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The most models one server answers for besides the default one
/// (each holds its teachers' connections, and trains its demo teachers at start).
const MAX_MORE_MODELS: usize = 15;

/// The version of every model's own tables (`[model]`, `[models.<name>]`).
pub const FIRST_VERSION: &str = "1";

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
    /// Its version: "1" for the model's own tables, V for
    /// `[versions.<name>.<V>]` (`settings::versions`).
    pub version: String,
    /// The dataset its teachers were trained on (a
    /// [`DatasetSettings::name`]).
    pub dataset: String,
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

impl ModelSettings {
    /// What its version number names, as the store keeps it per dataset
    /// (`start::identity`): a digest of its output (label or vector, d),
    /// the tensors its teachers are sent and read (input name and
    /// datatype, output name), and its teachers — the demo's data, subsets
    /// and fit, or each remote teacher's endpoint, model name and version,
    /// in subset order. Not its deadlines, retries, batching or the demo's
    /// listener: those change how it is asked, not what answers.
    pub fn identity(&self) -> String {
        use sha2::Digest;
        let output = match self.mode {
            OutputMode::Label { classes } => format!("label d={classes}"),
            OutputMode::Vector { dim } => format!("vector d={dim}"),
        };
        let call = &self.call;
        let tensors = format!(
            "input {} {} output {}",
            call.input_name,
            call.input_datatype,
            call.output_name.as_deref().unwrap_or("(the first)")
        );
        let lines =
            [output, tensors, format!("m={}", self.teachers.m())].into_iter().chain(teachers_of(&self.teachers));
        let mut h = sha2::Sha256::new();
        h.update(b"pacpriv-version-identity/v1\0");
        for line in lines {
            h.update((line.len() as u64).to_le_bytes());
            h.update(line.as_bytes());
        }
        crate::session::hex(&h.finalize())
    }
}

/// `[models.<name>]` as written: each table holds keys of the top-level
/// section of that name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMoreModel {
    #[serde(default)]
    dataset: Option<String>,
    #[serde(default)]
    model: BTreeMap<String, Value>,
    #[serde(default)]
    pub(super) teachers: BTreeMap<String, Value>,
    #[serde(default)]
    pub(super) demo: BTreeMap<String, Value>,
}

/// What the models are checked against: the default model, the
/// top-level sections' probe interval, and the datasets.
pub(super) struct Base<'a> {
    pub(super) model: &'a ModelSettings,
    pub(super) health_interval: Duration,
    pub(super) datasets: &'a [DatasetSettings],
}

/// Every `[models.<name>]` of `config` (the merged configuration), in
/// name order, validated as the top-level sections are, and against the
/// first model of its dataset ([`same_data`]) and every other model
/// ([`other_data`]); every dataset has a model.
///
/// # Errors
/// The first problem, naming its key under `models.<name>.` (or
/// `datasets.<name>` for a dataset no model is over).
pub(super) fn more_models(
    config: &Config,
    raw: &BTreeMap<String, RawMoreModel>,
    default: Base<'_>,
) -> Result<Vec<ModelSettings>, SettingsError> {
    if raw.len() > MAX_MORE_MODELS {
        return Err(err("models", format!("at most {MAX_MORE_MODELS} models besides the default one")));
    }
    let mut out = Vec::with_capacity(raw.len());
    for (name, tables) in raw {
        let within = |e: SettingsError| SettingsError { key: format!("models.{name}.{}", e.key), ..e };
        if !valid_name(name) {
            return Err(err(
                &format!("models.{name}"),
                "a model name is 1 to 64 lower-case letters, digits, '_', '.' or '-' (lower-case, so that \
                 PACPRIV__MODELS__NAME__… variables reach it)",
            ));
        }
        if *name == default.model.name {
            return Err(err(
                &format!("models.{name}"),
                "the default model (server.inference_model, or \"private\" when it is empty) already has this name",
            ));
        }
        let own_demo = !tables.demo.is_empty();
        let key = |section: &str| format!("models.{name}.{section}");
        let model: RawModel = overlay(config, "model", tables.model.clone(), &key("model"))?;
        let teachers: RawTeachers = overlay(config, "teachers", tables.teachers.clone(), &key("teachers"))?;
        let demo: RawDemo = overlay(config, "demo", tables.demo.clone(), &key("demo"))?;
        let (mode, input_shape) = model.validate().map_err(within)?;
        let fanout = teachers.validate(demo).map_err(within)?;
        if fanout.health_interval != default.health_interval {
            return Err(err(
                &format!("models.{name}.teachers.health_interval_ms"),
                "every model's teachers are probed together, every teachers.health_interval_ms: set it there",
            ));
        }
        let dataset = tables.dataset.clone().unwrap_or_else(|| DEFAULT_DATASET.to_owned());
        if !default.datasets.iter().any(|d| d.name == dataset) {
            let named: Vec<&str> = default.datasets.iter().map(|d| d.name.as_str()).collect();
            return Err(err(
                &format!("models.{name}.dataset"),
                format!("no dataset {dataset:?}: the datasets are {named:?} ([privacy] and [datasets.NAME])"),
            ));
        }
        let model = ModelSettings {
            name: name.clone(),
            version: FIRST_VERSION.to_owned(),
            dataset,
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
        let earlier = || std::iter::once(default.model).chain(&out);
        match earlier().find(|m| m.dataset == model.dataset) {
            Some(first) => same_data(&model, first)?,
            None => other_data(&model, earlier())?,
        }
        for other in earlier() {
            distinct(&model, other)?;
        }
        out.push(model);
    }
    if let Some(empty) =
        default.datasets.iter().find(|d| !std::iter::once(default.model).chain(&out).any(|m| m.dataset == d.name))
    {
        return Err(err(
            &format!("datasets.{}", empty.name),
            "no model is over this dataset: name it in a model's dataset key ([models.NAME] dataset = ...)",
        ));
    }
    Ok(out)
}

/// `model` is over the same data as `first`, its dataset's first model,
/// as far as the configuration can tell: the same m; teachers from the
/// same source (the demo's data is not the operator's); for demo teachers
/// the same split and subsets (`demo.seed`, `demo.canaries`). That
/// teacher i of a remote model was trained on subset i is the operator's
/// declaration (P7).
pub(super) fn same_data(model: &ModelSettings, first: &ModelSettings) -> Result<(), SettingsError> {
    let key = |k: &str| format!("models.{}.{k}", model.name);
    let (m, m0) = (model.teachers.m(), first.teachers.m());
    if m != m0 {
        let counted = match &model.teachers {
            TeacherSource::Demo { .. } => "demo.models",
            TeacherSource::Remote(Teachers::PerTeacher(_)) => "teachers.remote",
            TeacherSource::Remote(Teachers::Stacked { .. }) => "teachers.stacked.models",
        };
        return Err(err(
            &key(counted),
            format!(
                "{m} teachers, but dataset {:?} has m = {m0} (model {:?}): every model over the same data has one \
                 teacher per subset, teacher i trained on subset i",
                model.dataset, first.name
            ),
        ));
    }
    if matches!(model.teachers, TeacherSource::Demo { .. }) != matches!(first.teachers, TeacherSource::Demo { .. }) {
        return Err(err(
            &key("teachers.source"),
            format!(
                "the demo teachers are trained on the demo data and remote ones on yours: a model's teachers are \
                 over the same data as model {:?}'s (dataset {:?}) only if they come from the same source",
                first.name, model.dataset
            ),
        ));
    }
    if let (TeacherSource::Demo { seed, canaries, .. }, TeacherSource::Demo { seed: seed0, canaries: canaries0, .. }) =
        (&model.teachers, &first.teachers)
        && (seed != seed0 || canaries != canaries0)
    {
        return Err(err(
            &key("demo"),
            format!(
                "seed and canaries must be model {:?}'s (demo.seed, demo.canaries): they choose the data and its \
                 subsets, which every model of dataset {:?} shares",
                first.name, model.dataset
            ),
        ));
    }
    Ok(())
}

/// With demo teachers, the model `name` ([demo] `naive_bayes_model`; none
/// if empty) beside the default one: its teachers naive Bayes fits on the
/// same subsets (the same seed, m and canaries), served on a loopback port
/// of their own; put among `more` in name order.
///
/// # Errors
/// A name that is taken or invalid, or a default model whose teachers are
/// naive Bayes already, naming `demo.naive_bayes_model`.
pub(super) fn demo_naive_bayes(
    name: &str,
    default: &ModelSettings,
    more: &mut Vec<ModelSettings>,
) -> Result<(), SettingsError> {
    let TeacherSource::Demo { learner, .. } = &default.teachers else { return Ok(()) };
    if name.is_empty() {
        return Ok(());
    }
    let key = "demo.naive_bayes_model";
    if *learner == DemoLearner::NaiveBayes {
        return Err(err(key, "the default model's teachers are naive Bayes already (demo.learner): set this to \"\""));
    }
    if !valid_name(name) {
        return Err(err(key, "a model name is 1 to 64 lower-case letters, digits, '_', '.' or '-'"));
    }
    if name == default.name || more.iter().any(|m| m.name == name) {
        return Err(err(key, format!("{name:?} is already a model: name this one otherwise, or set it to \"\"")));
    }
    let TeacherSource::Demo { models, seed, stacked, regularisation, canaries, .. } = default.teachers.clone() else {
        return Ok(());
    };
    let teachers = TeacherSource::Demo {
        models,
        seed,
        // Loopback whatever demo.listen says: raw teacher outputs are not
        // for the network, and this port is none an operator chose.
        listen: std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), 0),
        stacked,
        learner: DemoLearner::NaiveBayes,
        regularisation,
        canaries,
    };
    let model = ModelSettings { name: name.to_owned(), teachers, ..default.clone() };
    for other in more.iter() {
        distinct(&model, other).map_err(|e| err(key, format!("model {:?}: {}", other.name, e.message)))?;
    }
    let at = more.partition_point(|m| m.name.as_str() < name);
    more.insert(at, model);
    Ok(())
}

/// `model`, the first of its dataset, is not over the subsets of another
/// dataset's model among `others`, as far as the configuration can tell
/// (demo teachers of the same seed: the seed alone draws the split and
/// assigns every real example to its subsets, canaries or not): the same
/// subsets declared as two datasets would give every principal two
/// budgets over one secret.
fn other_data<'a>(model: &ModelSettings, others: impl Iterator<Item = &'a ModelSettings>) -> Result<(), SettingsError> {
    let TeacherSource::Demo { seed, .. } = &model.teachers else { return Ok(()) };
    for other in others {
        if let TeacherSource::Demo { seed: s, .. } = &other.teachers
            && s == seed
        {
            return Err(err(
                &format!("models.{}.demo", model.name),
                format!(
                    "the same demo.seed as model {:?} of dataset {:?}: the same subsets, so the same secret — put \
                     this model in dataset {:?}, or give dataset {:?} another seed",
                    other.name, other.dataset, other.dataset, model.dataset
                ),
            ));
        }
    }
    Ok(())
}

/// `model` and `other` are two models: not the same teachers under two
/// names, nor demo teachers on one listener.
pub(super) fn distinct(model: &ModelSettings, other: &ModelSettings) -> Result<(), SettingsError> {
    let key = |k: &str| format!("models.{}.{k}", model.name);
    if let (TeacherSource::Demo { listen, .. }, TeacherSource::Demo { listen: listen0, .. }) =
        (&model.teachers, &other.teachers)
        && listen.port() != 0
        && listen == listen0
    {
        return Err(err(
            &key("demo.listen"),
            format!("{listen} is model {:?}'s demo.listen: use another port, or 0", other.name),
        ));
    }
    if teachers_of(&model.teachers) == teachers_of(&other.teachers) {
        return Err(err(
            &key("teachers"),
            format!(
                "the same teachers as model {:?}: give this model its own (teachers.remote, teachers.stacked, or \
                 for the demo demo.learner or demo.regularisation)",
                other.name
            ),
        ));
    }
    Ok(())
}

/// Which teachers `source` names: the demo's data, subsets and fit, or
/// each remote model's endpoint, name and version.
fn teachers_of(source: &TeacherSource) -> Vec<String> {
    match source {
        TeacherSource::Demo { learner: DemoLearner::Logistic, regularisation, seed, canaries, models, .. } => {
            vec![format!("demo m={models} seed={seed} canaries={canaries} regularisation={regularisation}")]
        }
        TeacherSource::Demo { learner: DemoLearner::NaiveBayes, seed, canaries, models, .. } => {
            vec![format!("demo m={models} seed={seed} canaries={canaries} naive_bayes")]
        }
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
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-'))
}
