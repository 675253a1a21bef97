//! `pacpriv budget`: what T queries at b nats each mean (MIA success bound
//! and ε-equivalent, paper Eq. 2 and Table 1), and the largest T that meets a
//! target bound. All arithmetic is in [`pacpriv_privacy::report`].

use anyhow::Context;
use pacpriv_privacy::conservative::mul_up;
use pacpriv_privacy::report::{self, DELTA};
use pacpriv_privacy::{Nats, PrivacyError};
use std::fmt::Display;
use std::io::Write;

/// Arguments of `pacpriv budget`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Per-query MI budget b, in nats: a decimal (0.0039, 1e-5) or a power of
    /// two (2^-32).
    #[arg(long, value_name = "NATS", value_parser = parse_per_query, allow_negative_numbers = true)]
    pub per_query_mi: PerQuery,

    /// Number of answered queries T.
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub queries: u64,

    /// Also print the largest T whose MIA success bound is at most this
    /// percentage (e.g. 51.08 or 60).
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true, conflicts_with = "target_epsilon")]
    pub target_mia: Option<f64>,

    /// Also print the largest T whose MIA success bound is at most that of
    /// (EPS, δ = 1e-5)-DP (Table 1 uses 1 and 8).
    #[arg(long, value_name = "EPS", allow_negative_numbers = true)]
    pub target_epsilon: Option<f64>,
}

/// `--per-query-mi` as typed (e.g. `2^-32`, echoed back) and its value.
#[derive(Clone, Debug)]
pub struct PerQuery {
    /// The argument as the operator wrote it.
    pub given: String,
    /// Its value.
    pub nats: Nats,
}

/// Parses `--per-query-mi`, saying why a number was rejected.
pub(crate) fn parse_per_query(s: &str) -> Result<PerQuery, PrivacyError> {
    parse_nats(s, "the per-query MI")
}

/// Parses an MI argument as typed; a number that is not a valid quantity
/// is reported as `what`.
pub(crate) fn parse_nats(s: &str, what: &'static str) -> Result<PerQuery, PrivacyError> {
    let nats = s.parse::<Nats>().map_err(|parse_error| match s.trim().parse::<f64>() {
        Ok(value) => PrivacyError::InvalidNats { what, value },
        Err(_) => parse_error,
    })?;
    Ok(PerQuery { given: s.trim().to_owned(), nats })
}

/// Prints the report for `args` to `out`.
///
/// # Errors
/// A target outside its domain (the message names the flag), T·b
/// overflowing, or a failed write.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let b = args.per_query_mi.nats;
    let t = args.queries;
    let total = mul_up(t, b).context("total MI T·b")?;
    let mia = report::mia_bound(total);
    let eps = report::epsilon_equivalent(mia);
    // Check the target before printing anything.
    let target = match (args.target_mia, args.target_epsilon) {
        (Some(pct), _) => {
            let t_max =
                report::max_queries_for_mia(b, pct / 100.0).with_context(|| format!("--target-mia {pct} (percent)"))?;
            Some((format!("largest T with MIA ≤ {pct} %"), t_max))
        }
        (None, Some(eps)) => {
            let t_max = report::max_queries_for_epsilon(b, eps).with_context(|| format!("--target-epsilon {eps}"))?;
            Some((format!("largest T with ε ≤ {eps}"), t_max))
        }
        (None, None) => None,
    };

    row(out, "per-query MI b", format!("{} = {b} nats", args.per_query_mi.given))?;
    row(out, "queries T", t)?;
    row(out, "total MI B = T·b", format!("{total} nats"))?;
    row(out, "MIA success bound", percent(mia))?;
    row(out, format!("ε-equivalent (δ = {DELTA:e})"), epsilon(eps))?;
    if let Some((label, t_max)) = target {
        row(out, label, count(t_max))?;
    }
    Ok(())
}

/// One `label  value` line: values aligned in one column, at least two
/// spaces after any label.
fn row(out: &mut dyn Write, label: impl Display, value: impl Display) -> std::io::Result<()> {
    writeln!(out, "{:<25}  {value}", label.to_string())
}

/// A success rate (a fraction) as a percentage with 2 decimals.
fn percent(s: f64) -> String {
    format!("{:.2} %", 100.0 * s)
}

/// A planned T, exact and as Table 1 prints it; `u64::MAX` means b = 0.
fn count(t: u64) -> String {
    if t == u64::MAX { "unlimited".to_owned() } else { format!("{t} ({})", report::compact_count(t)) }
}

/// ε with 4 decimals, `∞` once the MIA bound is saturated.
fn epsilon(eps: f64) -> String {
    if eps.is_infinite() { "∞".to_owned() } else { format!("{eps:.4}") }
}
