//! The noise-key file: what `pacpriv admin export --noise-key FILE` writes
//! and `pacpriv verify --noise-key FILE` reads. JSON:
//!
//! ```text
//! {"format":"pacpriv-noise-keys/1","keys":[{"dataset":"default","key":"<64 hex>","commitment":"<64 hex>"}]}
//! ```
//!
//! # Invariants
//! - A key is read only if its commitment is the one written beside it
//!   ([`NoiseKey::commitment`]): a corrupted or mismatched file is refused,
//!   never used.
//! - The file is created anew, readable by its owner alone (mode 0600 on
//!   Unix; a file or symlink already at the path is removed first): the
//!   key lets its holder tell the secret index.

use super::format::{hex, unhex};
use anyhow::{Context, bail};
use pacpriv_privacy::keyed::NoiseKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The first field's value.
pub const KEYS_FORMAT: &str = "pacpriv-noise-keys/1";

/// The file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    format: String,
    keys: Vec<KeyLine>,
}

/// One dataset's key.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyLine {
    dataset: String,
    key: String,
    commitment: String,
}

/// Writes `keys` (dataset, key) to `path`, readable by its owner alone.
///
/// # Errors
/// I/O.
pub fn write(path: &Path, keys: &[(String, NoiseKey)]) -> anyhow::Result<()> {
    let file = KeyFile {
        format: KEYS_FORMAT.into(),
        keys: keys
            .iter()
            .map(|(dataset, key)| KeyLine {
                dataset: dataset.clone(),
                key: hex(key.expose()),
                commitment: hex(&key.commitment()),
            })
            .collect(),
    };
    // A new file, never an existing one's permissions nor a symlink's
    // target: what is there is removed first (a link itself, not what it
    // points at).
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot replace {}", path.display())),
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut out = options.open(path).with_context(|| format!("cannot write {}", path.display()))?;
    serde_json::to_writer(&mut out, &file)?;
    std::io::Write::write_all(&mut out, b"\n").with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The keys in `path`, by dataset.
///
/// # Errors
/// Unreadable, not a key file, or a key whose commitment is not the one
/// written beside it.
pub fn read(path: &Path) -> anyhow::Result<BTreeMap<String, NoiseKey>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the noise-key file {shown}"))?;
    let file: KeyFile = serde_json::from_str(&text)
        .with_context(|| format!("{shown} is not a noise-key file (`pacpriv admin export --noise-key FILE`)"))?;
    if file.format != KEYS_FORMAT {
        bail!("{shown}: format {:?}, expected {KEYS_FORMAT:?}", file.format);
    }
    let mut keys = BTreeMap::new();
    for line in file.keys {
        let bytes: [u8; 32] = unhex(&line.key)
            .and_then(|b| b.try_into().ok())
            .with_context(|| format!("{shown}: dataset {:?}'s key is not 64 hex digits", line.dataset))?;
        let key = NoiseKey::from_bytes(bytes);
        if hex(&key.commitment()) != line.commitment.to_ascii_lowercase() {
            bail!("{shown}: dataset {:?}'s key does not match the commitment beside it", line.dataset);
        }
        keys.insert(line.dataset, key);
    }
    Ok(keys)
}
