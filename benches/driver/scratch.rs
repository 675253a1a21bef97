//! Scratch directories for the benchmarks' stores: fresh, on a disk (a
//! durable rate measured on tmpfs says nothing), removed afterwards.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A directory this process created, removed with its contents on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new directory `pacpriv-bench-PID-N` under `parent`.
    fn new(parent: &Path) -> std::io::Result<Scratch> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = parent.join(format!("pacpriv-bench-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Scratch(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh temporary directory under `parent` (default: the current
/// directory), removed when dropped, with the type of the filesystem it is
/// on. Refuses tmpfs and ramfs: fsync there costs nothing, so a durable
/// rate measured there says nothing about a disk.
///
/// # Errors
/// The directory cannot be created, or is RAM-backed.
pub fn scratch(parent: Option<&Path>) -> anyhow::Result<(Scratch, String)> {
    let parent = match parent {
        Some(p) => p.to_owned(),
        None => std::env::current_dir().context("the current directory")?,
    };
    let dir =
        Scratch::new(&parent).with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    let fs = filesystem(dir.path()).unwrap_or_else(|| "unknown filesystem".to_owned());
    if matches!(fs.as_str(), "tmpfs" | "ramfs") {
        bail!("{} is on {fs}, where fsync is free; pass --dir on a disk-backed filesystem", parent.display());
    }
    Ok((dir, fs))
}

/// The type of the filesystem `path` is on (the longest mount point in
/// /proc/mounts that contains it), if that can be told.
fn filesystem(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            // Spaces and the like are octal-escaped there (\040).
            let point = point.replace("\\040", " ").replace("\\011", "\t");
            path.starts_with(&point).then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}
