//! A journaled step replayed: its posterior update, Σ, certificate,
//! charge and ledger re-derived from the teachers' outputs it records
//! ([`pacpriv_privacy::replay`]).

use super::chain::with_altered;
use super::format::{self, EntryLine};
use super::{KeyedSoFar, Options, Replaying};
use ndarray::Array2;
use pacpriv_privacy::keyed::Position;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{SessionState, TeacherOutputs};
use pacpriv_privacy::noise::Floor;
use pacpriv_privacy::noise_audit::{self, NoiseAudit};
use pacpriv_privacy::posterior::{Posterior, UpdateRule};
use pacpriv_privacy::replay::{self, Recorded, Unchecked};
use pacpriv_privacy::vector;
use pacpriv_privacy::{Nats, PrivacyError};

impl Replaying {
    /// Checks entry `e` (the next one of this session, at `line`) and
    /// applies it. A step that does not match is applied as recorded and
    /// reported; one whose update cannot be checked is listed (with
    /// `allow_unchecked`) or reported. `keyed`: what the keyed steps so far
    /// showed.
    pub(super) fn step(
        &mut self,
        e: &EntryLine,
        line: usize,
        options: Options<'_>,
        keyed: &mut KeyedSoFar,
    ) -> Result<(), String> {
        if self.broken {
            return Ok(());
        }
        if e.version != self.version + 1 {
            self.broken = true;
            return Err(if self.version == 0 {
                format!(
                    "the journal starts at version {}: the steps before it are missing (removed, or never \
                     journaled because store.journal was off then), so the account cannot be re-derived",
                    e.version
                )
            } else {
                format!(
                    "expected version {} next: a record is missing or out of order (the rest of this session is \
                     not checked)",
                    self.version + 1
                )
            });
        }
        let fail = |this: &mut Self, what: String| {
            this.broken = true;
            Err(format!("{what} (the rest of this session is not checked)"))
        };
        let entry = match e.entry() {
            Some(entry) => entry,
            None => return fail(self, "a hash or digest is not hex".into()),
        };
        let computed = entry.chained(&self.head);
        let s = &e.step;
        let parsed = outputs(s).and_then(|outputs| {
            let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
            let rule = UpdateRule::from_code(e.update_rule).ok_or_else(|| {
                format!(
                    "posterior update rule {} is not one this release knows; verify with a newer pacpriv",
                    e.update_rule
                )
            })?;
            // An unknown path is not an unrecorded one: read as "none" it
            // would get the looser checks of journals from before paths.
            let path = match (s.basis, vector::Path::from_code(s.basis, s.rank)) {
                (0, _) => None,
                (_, Some(path)) => Some(path),
                (basis, None) => {
                    return Err(format!(
                        "vector basis path {basis} is not one this release knows; verify with a newer pacpriv"
                    ));
                }
            };
            if s.calibration > vector::RULES {
                return Err(format!(
                    "calibration rules {} are not ones this release knows; verify with a newer pacpriv",
                    s.calibration
                ));
            }
            // A path the step's own rules rule out would be a second Σ to
            // choose from after the draw (a server journaling no rules to
            // keep the older ones' choice is named below).
            if let (TeacherOutputs::Vectors(v), Some(path)) = (&outputs, path)
                && let Some(why) = path.refused_under(s.calibration, v.nrows(), v.ncols())
            {
                return Err(format!("{why}: Σ was chosen another way than the mechanism chooses it"));
            }
            Ok((outputs, policy, rule, path))
        });
        let (outputs, policy, rule, path) = match parsed {
            Ok(parsed) => parsed,
            Err(what) => return fail(self, what),
        };
        // Rules that go back within a session would let a server take
        // whichever rules' path suits it after each draw (under rules 1,
        // path 3 where rules 2 check from G): an upgrade raises them, and
        // nothing lowers them.
        if s.calibration < self.rules {
            let what = format!(
                "calibration rules {} after a step under rules {}: a server's rules never go back within a \
                 session, and two sets of them would leave two paths, and so two Σ, to choose from after the draw",
                s.calibration, self.rules
            );
            return fail(self, what);
        }
        self.rules = s.calibration;
        let nats = |x: f64| Nats::new(x).map_err(|e| e.to_string());
        let state = match self.state.take() {
            Some(state) => Ok(state),
            None => Posterior::uniform(outputs.len()).map_err(|e| e.to_string()).and_then(|posterior| {
                let ledger = Ledger::new(nats(s.per_query)?, nats(s.limit)?, policy).map_err(|e| e.to_string())?;
                Ok(SessionState { posterior, ledger })
            }),
        };
        let state = state.and_then(|state| {
            // b, the limit and the policy are the step's own (a restart may
            // change them); what was spent carries over.
            let l = &state.ledger;
            let ledger =
                Ledger::restore(nats(s.per_query)?, nats(s.limit)?, policy, l.spent(), l.answered(), l.charged())
                    .map_err(|e| e.to_string())?;
            Ok(SessionState { ledger, ..state })
        });
        let mut state = match state {
            Ok(state) => state,
            Err(what) => return fail(self, what),
        };
        let audit = self.audit.get_or_insert_with(|| NoiseAudit::new(outputs.len()));
        let recorded = Recorded {
            outputs: &outputs,
            published: &s.published,
            label: s.label as usize,
            charge: e.charge,
            log_likelihood: &e.log_likelihood,
            update_rule: rule,
            path,
            rules: s.calibration,
            // Every step since committed noise commits to a key and floors
            // Σ's weak directions where the key audit resolves them.
            floor: if s.noise_key.is_empty() { Floor::RoundOff } else { Floor::Resolvable },
        };
        // The key a step's commitment names: its dataset's, found by the
        // commitment itself (a session key does not always name its
        // dataset: the default one's are bare principal names, which may
        // hold a '/').
        // One session is one dataset's: every step commits to one key.
        if !s.noise_key.is_empty() {
            let commitment = s.noise_key.to_ascii_lowercase();
            if self.commitment.is_empty() {
                self.commitment = commitment;
            } else if self.commitment != commitment {
                return fail(
                    self,
                    "its draw committed to another noise key than the session's earlier steps: a session is one \
                     dataset's, and a dataset has one key"
                        .into(),
                );
            }
        }
        let key = match (options.keys.is_empty(), s.noise_key.is_empty()) {
            (false, false) => {
                let commitment = s.noise_key.to_ascii_lowercase();
                match options.keys.iter().find(|(_, k)| format::hex(&k.commitment()) == commitment) {
                    Some((dataset, key)) => Some((dataset.clone(), *key)),
                    None => {
                        return fail(
                            self,
                            "its draw came from a noise key that --noise-key does not hold (no key there has its \
                             commitment): the keys given are refused for it; export them all with `pacpriv admin \
                             export --noise-key`"
                                .into(),
                        );
                    }
                }
            }
            _ => None,
        };
        let replayed = match &key {
            Some((dataset, key)) => {
                self.dataset.clone_from(dataset);
                let at = Position { dataset, session: &self.session, step: e.version };
                replay::replay_keyed(&mut state, &recorded, key, &at)
            }
            None => replay::replay(&mut state, &recorded),
        };
        let verdict = match replayed {
            Ok(replayed) => {
                self.worst = self.worst.max(replayed.mi_bound / s.per_query);
                self.slack += replayed.slack;
                let mut exact = None;
                match &replayed.evidence {
                    Some(evidence) => {
                        audit.add(evidence);
                        // Left to the bets where honest noise rounds to it now and then.
                        exact = (evidence.exact && evidence.exact_chance <= noise_audit::EXACT_FINDING).then(|| {
                            "its release equals a teacher's output exactly, although the teachers disagree and \
                             noise the 2^-32 grid resolves was due: it was released without noise"
                                .to_owned()
                        });
                    }
                    None => self.exact_steps += 1,
                }
                let keyed_finding = self.key_audit(&replayed, &s.noise_key, keyed, line);
                // Said once a session: its other steps are alike.
                let unkeyed = (s.noise_key.is_empty()
                    && replayed.evidence.is_some()
                    && !options.allow_unkeyed
                    && !std::mem::replace(&mut self.unkeyed_said, true))
                .then(|| {
                    "its draw commits to no noise key, although every noisy release of this pacpriv version \
                     commits to its dataset's: nothing ties it, or the session's later such steps, to a key the key \
                     audit could check; if the store holds steps from before committed noise (export format 3), \
                     verify with --allow-unkeyed to audit them statistically only"
                        .to_owned()
                });
                // A server journaling no rules would keep the older ones'
                // choice of two paths: counted under --allow-unversioned,
                // else said once a session, as above.
                let keyed_vector = matches!(outputs, TeacherOutputs::Vectors(_))
                    && !s.noise_key.is_empty()
                    && replayed.evidence.is_some();
                let older = keyed_vector && s.calibration == 0;
                if older && options.allow_unversioned {
                    self.unversioned_steps += 1;
                }
                let unversioned = (older
                    && !options.allow_unversioned
                    && !std::mem::replace(&mut self.unversioned_said, true))
                .then(|| {
                    "its vector basis path records no calibration rules, although every server of this pacpriv \
                     version records the ones it followed: under the rules before them two paths, and so two Σ, \
                     were open to a server for the same outputs, to choose from after the draw; if the store holds \
                     vector steps from before issue 70's SVD rank (export format 4 or earlier), verify with \
                     --allow-unversioned"
                        .to_owned()
                });
                // Steps drawn from a key journal their basis path too (the
                // same format): without it the audit would fall back to the
                // looser rule for either basis.
                let pathless = (keyed_vector && recorded.path.is_none()).then(|| {
                    "its draw committed to a noise key but it journals no basis path, as every such step does"
                        .to_owned()
                });
                let checked = match replayed.unchecked {
                    Some(_) if options.allow_unchecked => {
                        self.unchecked.push(line);
                        None
                    }
                    Some(why) => Some(unchecked(why)),
                    None => None,
                };
                let found: Vec<String> = checked
                    .into_iter()
                    .chain(exact)
                    .chain(pathless)
                    .chain(unkeyed)
                    .chain(unversioned)
                    .chain(keyed_finding)
                    .collect();
                if found.is_empty() { Ok(()) } else { Err(found.join("; and ")) }
            }
            Err(mismatch) => match replay::apply_recorded(&mut state, &recorded) {
                Ok(()) => Err(mismatch.to_string()),
                Err(_) => return fail(self, mismatch.to_string()),
            },
        };
        if let Some(digest) = entry.step.map(|s| s.digest).filter(|d| !d.is_empty()) {
            self.answered.insert(digest, (s.label, s.published.clone()));
        }
        self.limit = s.limit;
        self.state = Some(state);
        let altered = self.follow(&entry.chain, computed);
        self.version = e.version;
        with_altered(altered, verdict)
    }
}

/// Why a step's update could not be checked, as a finding.
fn unchecked(why: Unchecked) -> String {
    format!("{why} (--allow-unchecked lists such steps instead of failing)")
}

/// The teachers' outputs a step records.
pub(super) fn outputs(s: &format::StepLine) -> Result<TeacherOutputs, String> {
    match (s.classes, s.dim) {
        (classes, 0) if classes > 0 => Ok(TeacherOutputs::Labels {
            labels: s.labels.iter().map(|&l| l as usize).collect(),
            classes: classes as usize,
        }),
        (0, dim) if dim > 0 && s.vectors.len().is_multiple_of(dim as usize) => {
            let m = s.vectors.len() / dim as usize;
            Array2::from_shape_vec((m, dim as usize), s.vectors.clone())
                .map(TeacherOutputs::Vectors)
                .map_err(|e| e.to_string())
        }
        _ => Err("the step records neither labels (classes, labels) nor vectors (dim, m × dim values)".into()),
    }
}
