//! `pacpriv subsets`: draw and write the secret-space assignment (paper
//! §4.2.1): each of N points in exactly M/2 of M subsets, from a ChaCha20
//! generator seeded with `--seed`, as `pacpriv-subsets/v1` JSON (format in
//! [`pacpriv_privacy::secret_space`]). The same seed gives the same bytes.

use anyhow::Context;
use pacpriv_privacy::secret_space::Assignment;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

/// Arguments of `pacpriv subsets`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of points N in the universe (e.g. the training-set size).
    #[arg(long, value_name = "N")]
    pub n: usize,

    /// Number of subsets M, one teacher each; even and at least 2.
    #[arg(long, value_name = "M", default_value_t = 128)]
    pub m: usize,

    /// Seed of the ChaCha20 generator. The assignment is public; the seed
    /// only makes it reproducible.
    #[arg(long, value_name = "S")]
    pub seed: u64,

    /// Write the JSON here instead of to standard output.
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

/// Writes the assignment to `--out`, or to `out` when no path is given.
///
/// # Errors
/// An invalid N or M (odd, < 2, N = 0), or a failed write.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let assignment =
        Assignment::from_seed(args.n, args.m, args.seed).with_context(|| format!("--n {} --m {}", args.n, args.m))?;
    let Some(path) = &args.out else {
        return write_json(&assignment, out).context("writing to standard output");
    };
    let write_file = || -> std::io::Result<()> {
        let mut file = BufWriter::new(std::fs::File::create(path)?);
        write_json(&assignment, &mut file)?;
        file.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    write_file().with_context(|| format!("writing {}", path.display()))?;
    // For the operator; standard output stays reserved for data.
    eprintln!(
        "wrote {} subsets of {} points (each point in {}), seed {}, to {}",
        args.m,
        args.n,
        args.m / 2,
        args.seed,
        path.display()
    );
    Ok(())
}

/// The JSON document and a final newline.
fn write_json(assignment: &Assignment, out: &mut dyn Write) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, assignment)?;
    writeln!(out)?;
    out.flush()
}
