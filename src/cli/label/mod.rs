//! `pacpriv label` (work in progress, issue 6).

/// Arguments of `pacpriv label`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pacpriv label`.
///
/// # Errors
/// Always, until implemented.
pub fn run(_args: Args, _out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    anyhow::bail!("pacpriv label is not implemented yet")
}
