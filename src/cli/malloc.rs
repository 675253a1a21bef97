//! How glibc's allocator keeps the memory of large arrays between answers.
//!
//! A vector-mode answer allocates a few m × d arrays (1 MiB each at
//! m = 128, d = 1000; 10 MiB at d = 10 000) and frees them when it
//! returns. glibc serves blocks above its mmap threshold (128 KiB, raised
//! as large blocks are freed) with fresh `mmap`s, and gives the top of the
//! heap back to the kernel once more than its trim threshold is free. So
//! every answer faulted its arrays in again, page by page: 3 million page
//! faults over 300 answers at d = 1000 and 10 000, and 8.5 against 6.0 ms
//! per answer at d = 1000
//! (`BENCHMARKS.md`, issue 44 §3). With the thresholds below, freed arrays
//! stay in the heap and the next answer reuses them.
//!
//! # Invariants
//! - Set through `GLIBC_TUNABLES`, which glibc reads only at load time, so
//!   the binaries run themselves again with it ([`super::startup`]).
//! - A `GLIBC_TUNABLES` already in the environment (an operator's, or the
//!   one asked for here) is left alone, whatever it sets.
//! - Only where memory comes from changes, never what is computed. The
//!   cost is resident memory after a burst: each glibc arena (up to 8 per
//!   core, as threads contend) keeps up to [`TRIM_THRESHOLD`] of what it
//!   freed, so the process stays near the high-water mark of its
//!   concurrent vector-mode answers instead of falling back after them.
//!   The peak itself does not change (eight threads of calibrations at
//!   d = 1 000, 3 000 and 10 000: `BENCHMARKS.md`, issue 44 §3).

use std::ffi::OsString;

/// The variable glibc reads its tunables from.
pub const TUNABLES: &str = "GLIBC_TUNABLES";

/// Blocks below this come from the heap, not from their own `mmap`:
/// 32 MiB, the ceiling glibc's own adaptive threshold stops at.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Free memory at the top of a heap is returned to the kernel only above
/// this: 32 MiB. Enough that a d = 1 000 answer's arrays (a few MiB) and
/// most of a d = 10 000 answer's (~45 MiB at its peak) stay between
/// answers; small enough that a thread done with a large answer returns
/// most of it (measured at 64 MiB, eight finished threads kept 380 MB).
pub const TRIM_THRESHOLD: usize = 32 << 20;

/// The `GLIBC_TUNABLES` value the binaries run with.
pub fn tunables() -> String {
    format!("glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
}

/// What the start-up re-execution should set, given the current value of
/// `GLIBC_TUNABLES` (`None`: unset).
pub fn tunables_to_request(current: Option<OsString>) -> Option<String> {
    match current {
        Some(_) => None,
        None => Some(tunables()),
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn an_operators_tunables_are_kept_and_unset_ones_get_the_thresholds() {
        assert_eq!(tunables_to_request(Some("glibc.malloc.arena_max=2".into())), None);
        assert_eq!(tunables_to_request(Some(OsString::new())), None);
        assert_eq!(
            tunables_to_request(None).as_deref(),
            Some("glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=33554432")
        );
    }
}
