//! Which OpenBLAS kernels the binaries run on.
//!
//! OpenBLAS chooses its kernels once, while the library loads (before
//! `main`), from the CPU model it recognises. The Debian OpenBLAS the image
//! and CI install (0.3.21) does not recognise every current CPU — on the
//! virtualised AVX-512 Xeons these benchmarks ran on it falls back to its
//! Prescott (SSE3) kernels, where GEMM is ~3× and a vector-mode answer at
//! d = 1000 ~1.9× slower (`BENCHMARKS.md`, issue 26 §2). `OPENBLAS_CORETYPE`
//! overrides the choice, but is read only at load time, so a binary that
//! wants it set runs itself again with it ([`super::startup`]).
//!
//! # Invariants
//! - Never asks for kernels whose instructions the CPU or the OS lack
//!   (`is_x86_feature_detected!` checks both).
//! - An `OPENBLAS_CORETYPE` already in the environment (an operator's, or
//!   the one this module asked for) is left alone.
//! - Only kernel selection changes: the calibration certifies whatever
//!   basis LAPACK returns (`docs/assurance/privacy-core.md` §2), and `pacpriv verify`
//!   replays the journaled Eq. 4 vector, not a recomputed one, so a
//!   verifier on other kernels reaches the same posterior bit for bit.

use std::ffi::OsString;

/// The variable OpenBLAS reads to override its CPU detection.
pub const CORETYPE: &str = "OPENBLAS_CORETYPE";

/// The widest OpenBLAS kernels this CPU runs: `SkylakeX` with AVX-512
/// (F, CD, BW, DQ, VL), `Haswell` with AVX2 and FMA; `None` otherwise (or
/// off x86-64), leaving OpenBLAS's own choice.
pub fn best_core() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512cd")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
        {
            return Some("SkylakeX");
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Some("Haswell");
        }
    }
    None
}

/// What the start-up re-execution should set, given the current value of
/// `OPENBLAS_CORETYPE` (`None`: unset) and the CPU's best core.
pub fn core_to_request(current: Option<OsString>, best: Option<&'static str>) -> Option<&'static str> {
    match current {
        Some(_) => None,
        None => best,
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn an_operators_choice_is_kept_and_an_unset_variable_gets_the_best_core() {
        assert_eq!(core_to_request(Some("Prescott".into()), Some("SkylakeX")), None);
        assert_eq!(core_to_request(Some(OsString::new()), Some("Haswell")), None);
        assert_eq!(core_to_request(None, Some("SkylakeX")), Some("SkylakeX"));
        assert_eq!(core_to_request(None, None), None);
    }
}
