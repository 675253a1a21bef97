//! The statistical noise audit over an export: one test over every session
//! ([`pacpriv_privacy::noise_audit::combine_export`]), its tables and its findings.
//!
//! s* is a dataset's, not a session's: an operator who opens a session per
//! dishonest release must not get fresh wealth with each. The
//! too-little-noise bets hold for every candidate whatever the secret, so
//! every session of the same number of teachers is in one test. A
//! session's dataset is known by the noise-key commitment its steps
//! recorded (issue 66), never by its name (the default dataset's session
//! keys are bare principal names, which may hold a '/'), and only once the
//! key file authenticates it: then its sessions share one secret in the
//! too-much-noise test; every other session is fitted on its own.

use super::{Finding, Verified};
use crate::plural;
use pacpriv_privacy::noise_audit::{self, Secret, UNCOVERED_WARNING, Verdict};
use std::collections::BTreeMap;
use std::io::Write;

/// The noise audit's test: every session of the export.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Its name in the report: m, and the datasets the key file
    /// authenticates among its sessions (`(no key given)` for the rest).
    pub name: String,
    /// Its sessions, in the export's order.
    pub sessions: Vec<String>,
    /// The combined verdict.
    pub verdict: Verdict,
    /// The record line of its last session (where findings are named).
    pub line: usize,
}

/// The export's test: every session with a noisy step, in one test
/// ([`noise_audit::combine_export`]). The too-little-noise bets hold for
/// every candidate whatever the secret, so every session is in it,
/// whichever dataset and number of teachers it claims: a commitment is only
/// a hex string in the export until a key (`names`: commitment → dataset,
/// from the key file) authenticates it, m only what the journal says, and
/// an operator must not get fresh wealth by writing another. Sessions whose commitment a key
/// authenticates share their dataset's secret (the too-much-noise test
/// fits one subset to all of them); the others are taken each with its
/// own.
pub fn datasets(sessions: &[Verified], names: &BTreeMap<String, String>) -> Vec<Dataset> {
    let mut by_m: BTreeMap<usize, BTreeMap<Option<&String>, Vec<&Verified>>> = BTreeMap::new();
    for s in sessions {
        if let Some(audit) = &s.audit {
            by_m.entry(audit.candidates()).or_default().entry(names.get(&s.commitment)).or_default().push(s);
        }
    }
    if by_m.is_empty() {
        return Vec::new();
    }
    let tested = by_m.values().map(|groups| {
        groups
            .iter()
            .map(|(dataset, members)| {
                let secret = if dataset.is_some() { Secret::Shared } else { Secret::Unknown };
                (members.iter().filter_map(|s| s.audit.as_ref()).collect::<Vec<_>>(), secret)
            })
            .collect::<Vec<_>>()
    });
    // Sessions are grouped by m, so every group has one m.
    let Some(verdict) = noise_audit::combine_export(tested) else {
        return Vec::new();
    };
    let name = by_m
        .iter()
        .map(|(m, groups)| {
            let named: Vec<&str> = groups.keys().map(|d| d.map_or("(no key given)", |d| d.as_str())).collect();
            format!("m = {m}: {}", named.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ");
    let members: Vec<&&Verified> = by_m.values().flat_map(|groups| groups.values().flatten()).collect();
    vec![Dataset {
        name,
        sessions: members.iter().map(|s| s.session.clone()).collect(),
        verdict,
        line: members.iter().map(|s| s.line).max().unwrap_or(1),
    }]
}

/// What the dataset tests find at `alpha`.
pub fn findings(datasets: &[Dataset], alpha: f64) -> Vec<Finding> {
    let mut found = Vec::new();
    for d in datasets {
        let v = &d.verdict;
        let who = format!("the sessions of {} ({})", d.name, quoted(&d.sessions));
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
/// out; then the one test over them all.
pub fn write(out: &mut dyn Write, sessions: &[Verified], datasets: &[Dataset], alpha: f64) -> std::io::Result<()> {
    writeln!(
        out,
        "noise audit (α = {alpha:e} for the export; statistic = min over subsets of the releases' squared residuals \
         in units of the calibrated variances, χ² on dof when honest; p_less, p_more: bounds on how likely honest \
         noise is to leave them this small, this large, over all its sessions):"
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
    writeln!(out, "test\tsessions\tnoisy_steps\tdof\tstatistic\tscale\tp_less\tp_more\tverdict")?;
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
    for s in sessions.iter().filter(|s| s.noise.steps > 0 && s.noise.untested() && s.commitment.is_empty()) {
        writeln!(
            out,
            "warning: session {:?}: none of its {} noisy steps had a direction the statistical audit could test, \
             and they were journaled before noise keys: nothing shows they carried noise",
            s.session, s.noise.steps
        )?;
    }
    for s in sessions.iter().filter(|s| s.noise.uncovered > UNCOVERED_WARNING) {
        writeln!(
            out,
            "warning: session {:?}: {:.1} % of the b charged on its noisy steps lies in directions no statistical \
             test covers (weak, unresolved or clamped); only the key audit (--noise-key) checks them, within its drift",
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
