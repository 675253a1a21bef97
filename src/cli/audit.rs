//! `pacpriv audit` (work in progress, issue 6).

/// Arguments of `pacpriv audit`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pacpriv audit`.
///
/// # Errors
/// Always, until implemented.
pub fn run(_args: Args, _out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    anyhow::bail!("pacpriv audit is not implemented yet")
}
