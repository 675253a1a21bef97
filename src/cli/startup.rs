//! What the binaries set in their own environment before anything else
//! runs: OpenBLAS's kernels ([`super::blas`]) and glibc's allocator
//! thresholds ([`super::malloc`]). Both libraries read their variables
//! only while the process loads, so [`tune_process`], the first thing each
//! `main` does, runs the binary again with them when they are missing.
//!
//! # Invariants
//! - At most one re-execution: the second process carries [`REEXECUTED`]
//!   and never runs itself again, even where the loader drops a variable it
//!   was given (glibc removes `GLIBC_TUNABLES` for setuid binaries and
//!   binaries with file capabilities).
//! - An operator's own setting of either variable is kept.
//! - If the re-execution fails, the process carries on as it is: slower,
//!   never different in what it computes.

/// Set in the environment of the re-executed process, so it never runs
/// itself again.
pub const REEXECUTED: &str = "PACPRIV_REEXECUTED";

/// Runs this binary again, with the same arguments and environment plus
/// whatever of `OPENBLAS_CORETYPE` and `GLIBC_TUNABLES` is missing, unless
/// nothing is. Returns only when it did not re-execute — including when
/// the exec itself failed. Call it first in `main`, before any thread or
/// runtime starts.
pub fn tune_process() {
    if std::env::var_os(REEXECUTED).is_some() {
        return;
    }
    let core = super::blas::core_to_request(std::env::var_os(super::blas::CORETYPE), super::blas::best_core());
    let tunables = super::malloc::tunables_to_request(std::env::var_os(super::malloc::TUNABLES));
    if core.is_none() && tunables.is_none() {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut args = std::env::args_os();
        let mut command = std::process::Command::new(exe);
        if let Some(arg0) = args.next() {
            command.arg0(arg0);
        }
        command.args(args).env(REEXECUTED, "1");
        if let Some(core) = core {
            command.env(super::blas::CORETYPE, core);
        }
        if let Some(tunables) = tunables {
            command.env(super::malloc::TUNABLES, tunables);
        }
        // `exec` returns only on failure; then carry on as we are.
        let _failed = command.exec();
    }
}
