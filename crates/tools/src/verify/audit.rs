//! The statistical noise audit over an export: one test per dataset
//! ([`pacpriv_privacy::noise_audit::combine`]), its table and its findings.
//!
//! s* is a dataset's, not a session's: an operator who opens a session per
//! dishonest release must not get fresh wealth with each. A session's
//! dataset is known by the noise-key commitment its steps recorded (issue
//! 66), never by its name (the default dataset's session keys are bare
//! principal names, which may hold a '/'). Sessions journaled before keys
//! committed to nothing: they are tested together as one group whose
//! secret is not known to be shared — the too-little-noise bets hold for
//! every candidate, and the too-much-noise test sums each session's best
//! fit.

use super::{Finding, Verified};
use crate::plural;
use pacpriv_privacy::noise_audit::{self, Secret, UNCOVERED_WARNING, Verdict};
use std::collections::BTreeMap;
use std::io::Write;

/// One dataset's audit.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Its name in the report: the key file's name for it, else its key's
    /// commitment (shortened), else `(no key commitment)`.
    pub name: String,
    /// Its sessions, in the export's order.
    pub sessions: Vec<String>,
    /// The combined verdict.
    pub verdict: Verdict,
    /// The record line of its last session (where findings are named).
    pub line: usize,
}

/// The export's datasets: its sessions grouped by the commitment their
/// steps recorded and by their number of candidates, named by `names`
/// (commitment → dataset, from the key file). Sessions without a noisy
/// step are left out.
pub fn datasets(sessions: &[Verified], names: &BTreeMap<String, String>) -> Vec<Dataset> {
    let mut groups: BTreeMap<(String, usize), Vec<&Verified>> = BTreeMap::new();
    for s in sessions {
        if let Some(audit) = &s.audit {
            groups.entry((s.commitment.clone(), audit.candidates())).or_default().push(s);
        }
    }
    let several_m = |commitment: &str| groups.keys().filter(|(c, _)| c == commitment).count() > 1;
    groups
        .iter()
        .filter_map(|((commitment, m), members)| {
            let secret = if commitment.is_empty() { Secret::Unknown } else { Secret::Shared };
            let verdict = noise_audit::combine(members.iter().filter_map(|s| s.audit.as_ref()), secret)?;
            let mut name = match (names.get(commitment), commitment.is_empty()) {
                (Some(name), _) => name.clone(),
                (None, true) => "(no key commitment)".to_owned(),
                (None, false) => format!("key {}…", &commitment[..commitment.len().min(16)]),
            };
            if several_m(commitment) {
                name.push_str(&format!(" (m = {m})"));
            }
            Some(Dataset {
                name,
                sessions: members.iter().map(|s| s.session.clone()).collect(),
                verdict,
                line: members.iter().map(|s| s.line).max().unwrap_or(1),
            })
        })
        .collect()
}

/// What the dataset tests find at `alpha`.
pub fn findings(datasets: &[Dataset], alpha: f64) -> Vec<Finding> {
    let mut found = Vec::new();
    for d in datasets {
        let v = &d.verdict;
        let who = format!("dataset {} (session{} {})", d.name, plural(d.sessions.len() as u64), quoted(&d.sessions));
        if v.less(alpha) {
            found.push(Finding {
                line: d.line,
                what: format!(
                    "{who}: its releases carry less noise than calibrated: the residual statistic is {:.6e} on {} \
                     degrees of freedom (apparent scale {:.4} of the calibrated noise), p ≤ {:.3e} < \
                     --noise-alpha/2 = {:e}",
                    v.statistic,
                    v.dof,
                    v.scale,
                    v.p_less,
                    0.5 * alpha
                ),
            });
        }
        if v.more(alpha) {
            found.push(Finding {
                line: d.line,
                what: format!(
                    "{who}: its releases lie farther from every subset's output than the calibrated noise puts \
                     them: the residual statistic is {:.6e} on {} degrees of freedom (apparent scale {:.4}), p ≤ \
                     {:.3e} < --noise-alpha/2 = {:e}; a release placed far out moves the posterior where its \
                     operator chose",
                    v.statistic,
                    v.dof,
                    v.scale,
                    v.p_more,
                    0.5 * alpha
                ),
            });
        }
    }
    found
}

/// `"a", "b"`, the first few.
fn quoted(sessions: &[String]) -> String {
    let shown: Vec<String> = sessions.iter().take(4).map(|s| format!("{s:?}")).collect();
    match sessions.len() {
        n if n > shown.len() => format!("{} and {} more", shown.join(", "), n - shown.len()),
        _ => shown.join(", "),
    }
}

/// The noise audit's tables: per session, its residuals and what was left
/// out; per dataset, the test.
pub fn write(out: &mut dyn Write, sessions: &[Verified], datasets: &[Dataset], alpha: f64) -> std::io::Result<()> {
    writeln!(
        out,
        "noise audit (α = {alpha:e} per dataset; statistic = min over subsets of the releases' squared residuals \
         in units of the calibrated variances, χ² on dof when honest; p_less, p_more: bounds on how likely honest \
         noise is to leave them this small, this large, over all of a dataset's sessions):"
    )?;
    writeln!(out, "session\tnoisy_steps\tdof\tstatistic\tscale\tuncovered_b\tfloor_only_b\tleft_out")?;
    for s in sessions {
        let v = &s.noise;
        writeln!(
            out,
            "{}\t{}\t{}\t{:.6e}\t{:.4}\t{:.1e}\t{:.1e}\t{}",
            s.session,
            v.steps,
            v.dof,
            v.statistic,
            v.scale,
            v.uncovered,
            v.floor_only,
            left_out(v, s.exact_steps)
        )?;
    }
    writeln!(out, "dataset\tsessions\tnoisy_steps\tdof\tstatistic\tscale\tp_less\tp_more\tverdict")?;
    for d in datasets {
        let v = &d.verdict;
        let verdict = match (v.untested(), v.caught(alpha)) {
            (_, true) => "fail",
            (true, false) => "nothing to test",
            (false, false) => "pass",
        };
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{:.6e}\t{:.4}\t{:.3e}\t{:.3e}\t{verdict}",
            d.name,
            d.sessions.len(),
            v.steps,
            v.dof,
            v.statistic,
            v.scale,
            v.p_less,
            v.p_more
        )?;
    }
    for s in sessions.iter().filter(|s| s.noise.uncovered > UNCOVERED_WARNING) {
        writeln!(
            out,
            "warning: session {:?}: {:.1} % of the b charged on its noisy steps lies in directions no statistical \
             test covers (weak, unresolved or clamped); only the key audit (--noise-key) checks them",
            s.session,
            100.0 * s.noise.uncovered
        )?;
    }
    Ok(())
}

/// What the audit left out and why, for the table.
fn left_out(v: &Verdict, exact_steps: u64) -> String {
    format!(
        "{exact_steps} unanimous step{}, {} clamped step{}, {} weak and {} unresolved direction{}, {} complement \
         dimension{}; {} left-out dimension{} tested against their floor",
        plural(exact_steps),
        v.clamped,
        plural(v.clamped),
        v.weak,
        v.unresolved,
        plural(v.weak + v.unresolved),
        v.complement,
        plural(v.complement),
        v.floor_dof,
        plural(v.floor_dof)
    )
}
