//! Where the secret subset index s* comes from: an operator-provided file,
//! or the OS CSPRNG at start-up. Errors never contain the index.
//!
//! Until the durable store lands (issue 4), a drawn index lives only in
//! memory: a restart draws a new one together with fresh sessions.

use crate::privacy::mechanism::SecretIndex;
use chacha20::ChaCha20Rng;
use rand::rngs::SysRng;
use rand::{RngExt, SeedableRng};
use std::path::Path;

/// Why no secret index could be established.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read.
    #[error("cannot read secret index file {path}: {reason}")]
    Read {
        /// The configured path.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The file does not hold an index below m (its content is not echoed).
    #[error("secret index file {path} must hold one decimal integer below the number of teachers ({m})")]
    Invalid {
        /// The configured path.
        path: String,
        /// Number of teachers.
        m: usize,
    },
    /// The OS random source failed.
    #[error("the OS random source failed: {0}")]
    Entropy(String),
}

/// Reads the index from `file`, or draws it uniformly from the OS CSPRNG.
///
/// # Errors
/// [`SecretError`].
pub fn load_or_draw(file: Option<&Path>, m: usize) -> Result<SecretIndex, SecretError> {
    let Some(path) = file else {
        let mut rng = ChaCha20Rng::try_from_rng(&mut SysRng).map_err(|e| SecretError::Entropy(e.to_string()))?;
        let i = rng.random_range(0..m);
        return SecretIndex::new(i, m).map_err(|_| SecretError::Invalid { path: "(drawn)".into(), m });
    };
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| SecretError::Read { path: shown.clone(), reason: e.to_string() })?;
    let invalid = || SecretError::Invalid { path: shown.clone(), m };
    let i: usize = text.trim().parse().map_err(|_| invalid())?;
    SecretIndex::new(i, m).map_err(|_| invalid())
}
