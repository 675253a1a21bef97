//! A session being re-derived: its start ([`Replaying::new`]) and its
//! end, where the stored record is compared with the replayed state
//! ([`Replaying::finish`]).

use super::Replaying;
use super::format::{self, RecordLine};
use super::report::Verified;
use crate::plural;
use pacpriv_privacy::noise_audit::NoiseAudit;
use pacpriv_privacy::posterior::Form;
use pacpriv_records::JournalEntry;
use std::collections::HashMap;

impl Replaying {
    pub(super) fn new(session: &str) -> Self {
        Replaying {
            session: session.to_owned(),
            dataset: String::new(),
            commitment: String::new(),
            keyed_steps: 0,
            statistical_steps: 0,
            undetectable: 0.0,
            unresolved: 0,
            state: None,
            head: JournalEntry::genesis(session),
            version: 0,
            events: 0,
            cache_hits: 0,
            refusals: 0,
            answered: HashMap::new(),
            limit: 0.0,
            worst: 0.0,
            unchecked: Vec::new(),
            audit: None,
            exact_steps: 0,
            slack: 0.0,
            broken: false,
            unkeyed_said: false,
            unversioned_said: false,
            unversioned_steps: 0,
            rules: 0,
        }
    }

    /// Compares the stored record (at `line`) with the replayed end state;
    /// every difference found.
    pub(super) fn finish(self, record: &RecordLine, line: usize) -> Result<Verified, Vec<String>> {
        if self.broken {
            // Said at the gap.
            return Err(Vec::new());
        }
        let mut problems = Vec::new();
        if record.version != self.version {
            problems.push(if self.version == 0 {
                format!("its record is at version {} but none of its steps is journaled", record.version)
            } else {
                format!("its record is at version {}, its journal ends at {}", record.version, self.version)
            });
        }
        if record.journal_events != self.events {
            problems
                .push(format!("its record counts {} events, its journal has {}", record.journal_events, self.events));
        }
        // A record written before its session's first journaled item may
        // carry no head at all.
        let fresh = self.version == 0 && self.events == 0;
        if record.journal_head != format::hex(&self.head) && !(fresh && record.journal_head.is_empty()) {
            problems.push("its record's chain head is not its journal's last chain hash".into());
        }
        let noise = self.audit.as_ref().map_or_else(|| NoiseAudit::new(0).verdict(), NoiseAudit::verdict);
        // Committed steps can be checked exactly with the key; steps from
        // before keys only warn (`audit::write`).
        if noise.steps > 0 && noise.untested() && self.keyed_steps < noise.steps && !self.commitment.is_empty() {
            problems.push(format!(
                "{} of its noisy step{} were charged b and audited statistically, but no direction of their noise \
                 could be tested (each weak, below the 2^-32 grid's resolution, or clamped): nothing shows they \
                 carried noise; verify with the dataset's --noise-key to check them exactly",
                noise.steps - self.keyed_steps,
                plural(noise.steps - self.keyed_steps)
            ));
        }
        let Some(state) = self.state else {
            if !problems.is_empty() {
                return Err(problems);
            }
            return Ok(Verified {
                session: self.session,
                steps: 0,
                cache_hits: self.cache_hits,
                refusals: self.refusals,
                charged: 0,
                spent: record.spent,
                limit: record.limit,
                worst_certificate: 0.0,
                unchecked: self.unchecked,
                update_slack: 0.0,
                noise,
                audit: None,
                commitment: self.commitment,
                line,
                exact_steps: 0,
                keyed_steps: 0,
                statistical_steps: 0,
                unversioned_steps: 0,
                undetectable: 0.0,
                unresolved: 0,
            });
        };
        let l = &state.ledger;
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits();
        if !same(l.spent().get(), record.spent) || l.answered() != record.answered || l.charged() != record.charged {
            problems.push(format!(
                "its record says spent {:e} nats in {} answers ({} charged); the journal adds up to {:e} in {} ({})",
                record.spent,
                record.answered,
                record.charged,
                l.spent().get(),
                l.answered(),
                l.charged()
            ));
        }
        let stored = Form::from_fields(record.log_weights.clone(), record.weights.clone());
        if !stored.is_some_and(|f| f.same_bits(state.posterior.form())) {
            problems.push("its record's posterior is not the one its journal replays to".into());
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Verified {
            session: self.session,
            steps: self.version,
            cache_hits: self.cache_hits,
            refusals: self.refusals,
            charged: l.charged(),
            spent: l.spent().get(),
            limit: self.limit,
            worst_certificate: self.worst,
            unchecked: self.unchecked,
            update_slack: self.slack,
            noise,
            audit: self.audit,
            commitment: self.commitment,
            line,
            exact_steps: self.exact_steps,
            keyed_steps: self.keyed_steps,
            statistical_steps: self.statistical_steps,
            unversioned_steps: self.unversioned_steps,
            undetectable: self.undetectable,
            unresolved: self.unresolved,
        })
    }
}
