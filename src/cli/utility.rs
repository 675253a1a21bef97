//! `pacpriv utility` (work in progress, issue 6).

/// Arguments of `pacpriv utility`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `pacpriv utility`.
///
/// # Errors
/// Always, until implemented.
pub fn run(_args: Args, _out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    anyhow::bail!("pacpriv utility is not implemented yet")
}
