//! Which demo model of the configuration a tool plays (`--model`): the
//! tools that train the demo teachers themselves (`audit`, `utility`)
//! rebuild the ones the server runs for that model version — its learner,
//! m, seed and canaries — and ask the server for that version by name, so
//! both sides mean the same teachers.

use anyhow::bail;
use pacpriv_demo::{Learner, Trained};
use pacpriv_service::settings::{ModelSettings, Settings, TeacherSource};
use pacpriv_service::teachers::OutputMode;

/// A demo model version, as a tool rebuilds it.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoModel {
    /// Its name (what `PredictRequest.model` carries).
    pub name: String,
    /// Its version (`PredictRequest.model_version`).
    pub version: String,
    /// m.
    pub m: usize,
    /// The split's and the subsets' seed.
    pub seed: u64,
    /// What each teacher is.
    pub learner: Learner,
    /// Canaries planted in the training data.
    pub canaries: usize,
    /// Label mode's classes.
    pub classes: usize,
}

impl DemoModel {
    /// The model `wanted` of `settings` — `NAME` (its newest version) or
    /// `NAME@V`; empty: the default model's newest version.
    ///
    /// # Errors
    /// No such model or version, remote teachers, or vector mode; each
    /// message says what `tool` needs.
    pub fn of(settings: &Settings, wanted: &str, tool: &str) -> anyhow::Result<DemoModel> {
        let (name, version) = wanted.split_once('@').unwrap_or((wanted, ""));
        let name = if name.is_empty() { settings.model.name.as_str() } else { name };
        let versions: Vec<&ModelSettings> = settings.models().filter(|m| m.name == name).collect();
        let chosen = if version.is_empty() {
            versions.iter().max_by_key(|m| m.version.parse::<u32>().unwrap_or(0)).copied()
        } else {
            versions.iter().find(|m| m.version == version).copied()
        };
        let Some(model) = chosen else {
            let served: Vec<String> = settings.models().map(|m| format!("{}@{}", m.name, m.version)).collect();
            bail!("--model {wanted:?}: no such model version in the configuration; it has {}", served.join(", "));
        };
        let TeacherSource::Demo { models, seed, learner, regularisation, canaries, .. } = &model.teachers else {
            bail!(
                "{tool} rebuilds the teachers it plays against, which it can do only for the demo ensemble: model \
                 {:?}'s teachers.source is \"remote\"",
                model.name
            );
        };
        let OutputMode::Label { classes } = model.mode else {
            bail!("{tool} works in label mode; model {:?} has model.mode = \"vector\"", model.name);
        };
        Ok(DemoModel {
            name: model.name.clone(),
            version: model.version.clone(),
            m: *models,
            seed: *seed,
            learner: learner.with(*regularisation),
            canaries: *canaries,
            classes,
        })
    }

    /// Its teachers, trained as the server trains them.
    ///
    /// # Errors
    /// A failed fit.
    pub fn train(&self) -> anyhow::Result<Trained> {
        Trained::train_learner(self.m, self.seed, self.learner, self.canaries).map_err(anyhow::Error::msg)
    }
}

#[cfg(test)]
mod test {
    use super::DemoModel;
    use pacpriv_demo::Learner;
    use pacpriv_service::settings::Settings;

    #[test]
    fn a_tool_names_a_model_and_version_of_the_configuration() -> anyhow::Result<()> {
        let env = [("PACPRIV__VERSIONS__PRIVATE__2__DEMO__REGULARISATION", "0.5")];
        let settings = Settings::load_with_env(None, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
        let of = |wanted: &str| DemoModel::of(&settings, wanted, "test");
        assert_eq!((of("")?.name, of("")?.version), ("private".to_owned(), "2".to_owned()), "the newest");
        assert_eq!(of("private@1")?.learner, Learner::Logistic { regularisation: 0.01 });
        assert_eq!(of("private@2")?.learner, Learner::Logistic { regularisation: 0.5 });
        assert_eq!((of("bayes")?.learner, of("bayes")?.m), (Learner::NaiveBayes, 128));
        assert!(of("nope").is_err() && of("private@3").is_err());
        Ok(())
    }
}
