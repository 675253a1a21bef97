//! The journal's hash chain: each step's entry and each refusal's event,
//! numbered and chained to the head before it, in the form `pacpriv
//! verify` re-derives from the records alone.
//!
//! # Invariants
//! - Every item is chained to the previous head (`chained`), so a journal
//!   with an item removed, reordered or edited does not verify.
//! - An entry records the teachers' outputs on the release grid, as the
//!   mechanism used them.

use super::cache::CacheKey;
use super::query::Asking;
use super::state::Versioned;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::mechanism::{Answer, TeacherOutputs};
use pacpriv_privacy::vector;
use pacpriv_store::record::{EventKind, JournalStepRecord};
use pacpriv_store::{JournalEntry, JournalEvent};

impl Versioned {
    /// The terms a journal item records: the query's digest (if any), b,
    /// the limit and the policy.
    pub(super) fn terms(&self, key: Option<&CacheKey>) -> JournalStepRecord {
        let ledger = &self.state.ledger;
        JournalStepRecord {
            digest: key.map(|k| k.digest.as_bytes().to_vec()).unwrap_or_default(),
            per_query: ledger.per_query().get(),
            limit: ledger.limit().get(),
            policy: ledger.policy().to_string(),
            ..Default::default()
        }
    }

    /// The terms of `asking`'s step ([`Versioned::terms`]) with the model
    /// that answered it.
    pub(super) fn answered_by(&self, asking: &Asking) -> JournalStepRecord {
        JournalStepRecord {
            model: asking.model.name.to_string(),
            model_version: asking.model.version.to_string(),
            ..self.terms(asking.key.as_ref())
        }
    }

    /// The journal event `kind` about query `query_id` (with `step`'s
    /// details; `need`: what an exhausted request needed), numbered and
    /// chained next.
    pub(super) fn event(
        &mut self,
        kind: EventKind,
        query_id: &str,
        step: JournalStepRecord,
        need: f64,
    ) -> JournalEvent {
        self.events += 1;
        let mut event = JournalEvent {
            seq: self.events,
            after_version: self.version,
            query_id: query_id.to_owned(),
            kind: kind.as_str().to_owned(),
            step: Some(step),
            spent: self.state.ledger.spent().get(),
            need,
            ..Default::default()
        };
        let chain = event.chained(&self.head);
        event.chain = chain.to_vec();
        self.head = chain;
        event
    }
}

/// The journal entry of the step that just took `v` to its version — what
/// it used and released, in the form `pacpriv verify` re-derives it from
/// (the teachers' outputs on the release grid, as the mechanism used them;
/// for a noisy step, the commitment to the noise key its draw came from)
/// — chained next.
pub(super) fn journal_entry(
    v: &mut Versioned,
    outputs: &TeacherOutputs,
    asking: &Asking,
    answer: &Answer,
    noise: &NoiseKey,
) -> JournalEntry {
    let mut step = JournalStepRecord {
        published: answer.published.clone(),
        label: answer.label as u32,
        // A unanimous step drew nothing: no key to commit to.
        noise_key: if answer.unanimous { Vec::new() } else { noise.commitment().to_vec() },
        basis: answer.path.map_or(0, |p| p.code().0),
        rank: answer.path.map_or(0, |p| p.code().1),
        calibration: vector::RULES,
        ..v.answered_by(asking)
    };
    record_outputs(&mut step, outputs);
    let mut entry = JournalEntry {
        version: v.version,
        query_id: asking.query_id.clone(),
        charge: answer.charge.get(),
        log_likelihood: answer.log_likelihood.as_ref().map(|l| l.to_vec()).unwrap_or_default(),
        update_rule: answer.update_rule.code(),
        step: Some(step),
        chain: Vec::new(),
    };
    let chain = entry.chained(&v.head);
    entry.chain = chain.to_vec();
    v.head = chain;
    entry
}

/// Puts the teachers' `outputs`, on the release grid, into `step`.
pub(super) fn record_outputs(step: &mut JournalStepRecord, outputs: &TeacherOutputs) {
    match &*outputs.on_grid() {
        TeacherOutputs::Labels { labels, classes } => {
            step.classes = *classes as u32;
            step.labels = labels.iter().map(|&l| l as u32).collect();
        }
        TeacherOutputs::Vectors(values) => {
            step.dim = values.ncols() as u32;
            step.vectors = values.iter().copied().collect();
        }
    }
}
