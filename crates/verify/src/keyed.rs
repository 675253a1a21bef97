//! The key audit of a keyed step: its release is one teacher's output
//! plus the noise key's draw at its position, that teacher is the one
//! every keyed step of its dataset matched, and its draw's alignment is
//! bet on ([`pacpriv_privacy::key_audit`]).

use super::{KeyedSoFar, Replaying};
use pacpriv_privacy::replay;

impl Replaying {
    /// The keyed audit of a replayed step whose journal recorded the noise
    /// key commitment `commitment` (hex; empty: drawn before keys): counts
    /// it, narrows the dataset's teachers in `keyed` (those that matched
    /// every keyed step so far) to the step's matching ones, and bets on
    /// its draw's alignment (at `line`). What it finds wrong.
    pub(super) fn key_audit(
        &mut self,
        replayed: &replay::Replayed,
        commitment: &str,
        keyed: &mut KeyedSoFar,
        line: usize,
    ) -> Option<String> {
        let Some(check) = &replayed.key else {
            // An exact step drew nothing: nothing to check.
            replayed.evidence.as_ref()?;
            self.statistical_steps += 1;
            // Named with or without the key given (M1 of the second review).
            return (commitment.is_empty() && !self.commitment.is_empty()).then(|| {
                "its draw was not taken from the noise key, although earlier steps of the session were: it can only \
                 be audited statistically"
                    .to_owned()
            });
        };
        self.keyed_steps += 1;
        self.undetectable = self.undetectable.max(check.undetectable);
        self.unresolved += check.unresolved as u64;
        if check.matching.is_empty() {
            return Some(format!(
                "its release is no teacher's output plus the noise key's draw at this step, in some direction of Σ: \
                 it carries other noise than the key gives (this step's check sees its noise scaled by any c below \
                 1 − {:.1e})",
                check.undetectable
            ));
        }
        if let Some(a) = check.alignment {
            let (bets, last) = keyed.sessions.entry(self.session.clone()).or_default();
            bets.add(a);
            *last = line;
        }
        let so_far = keyed.teachers.entry(self.dataset.clone()).or_insert_with(|| check.matching.clone());
        so_far.retain(|t| check.matching.contains(t));
        so_far.is_empty().then(|| {
            format!(
                "its release is one teacher's output plus the key's noise, but not the output of any teacher that \
                 every earlier keyed step of dataset {:?} matched: the releases are not all centred on one secret \
                 teacher",
                self.dataset
            )
        })
    }
}
