//! Committed noise: the keyed generator every release of the service draws
//! its standard normals from, so that an auditor holding the key can
//! recompute each release's draw exactly (argument:
//! `docs/assurance/privacy-core.md` §10; the audit: [`super::key_audit`]).
//!
//! A dataset's [`NoiseKey`] (256 bits from the OS CSPRNG, stored as s* is)
//! is expanded at a [`Position`] — the dataset, the session and the step's
//! version — into a stream:
//!
//! - the session's seed = HMAC-SHA256(key, "pacpriv-noise-draw/2" ‖
//!   len‖dataset ‖ len‖session), lengths as 8-byte big-endian integers
//!   ([`SessionDraws`], derived once per request, not per step);
//! - the step's seed = HMAC-SHA256(session seed, step), the step as 8
//!   bytes big-endian;
//! - the ChaCha20 keystream of the step's seed (RFC 8439, nonce 0, block
//!   counter from 0), read 8 bytes at a time as little-endian `u64` words;
//! - each pair of words (w₁, w₂) gives two normals by Box–Muller on 53-bit
//!   uniforms: u₁ = (⌊w₁/2¹¹⌋ + 1)·2⁻⁵³ ∈ (0, 1], u₂ = ⌊w₂/2¹¹⌋·2⁻⁵³,
//!   R = √(−2·ln u₁), z₁ = R·cos(2π·u₂), z₂ = R·sin(2π·u₂), in that order.
//!
//! ln, cos and sin come from `libm` (a pure-Rust port of musl's) and the
//! rest is IEEE +, ×, √, each correctly rounded: every machine computes the
//! same bits. Normals never exceed √(−2·ln 2⁻⁵³) ≈ 8.57 in magnitude.
//!
//! # Invariants
//! - A draw is a function of (key, position) alone: fixed before the
//!   step's inputs exist, so whoever holds the key has no choice of draw
//!   for a release (issue 66, H1 of its second review: with the inputs in
//!   the seed, b an ulp off or a teacher's output a grid step off gave a
//!   fresh draw to pick from). Two releases of a store differ in the
//!   position: the step's version is unique within a session's key, which
//!   is unique within a dataset (`accounting.md` §11, which also says what
//!   a store rolled back to an earlier version would cost).
//! - The key has no `Display` and a redacting `Debug`.
//! - Without the key the stream is indistinguishable from random
//!   (HMAC-SHA256 as a PRF, ChaCha20 as a stream cipher): the releases are
//!   as private as with the OS CSPRNG, computationally.

use chacha20::ChaCha20Rng;
use hmac::{Hmac, KeyInit, Mac};
use rand::{Rng, SeedableRng};
use sha2::{Digest, Sha256};

/// Domain of the key's commitment.
pub const COMMITMENT_DOMAIN: &[u8] = b"pacpriv-noise-key-commitment/1";

/// Domain of a draw's seed (`/1` also hashed the step's inputs).
pub const DRAW_DOMAIN: &[u8] = b"pacpriv-noise-draw/2";

/// A dataset's noise key: 32 bytes from the OS CSPRNG. Whoever holds it can
/// recompute every release's noise, and so tell s* from which teacher's
/// output each release is centred on: the same care as s*.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NoiseKey([u8; 32]);

impl NoiseKey {
    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        NoiseKey(bytes)
    }

    /// The bytes, for the store that keeps the key and the admin export
    /// that hands it to an auditor.
    pub fn expose(&self) -> &[u8; 32] {
        &self.0
    }

    /// SHA-256(domain ‖ key): what the journal records with every keyed
    /// step, so that an auditor can refuse any other key, and an operator
    /// cannot switch keys without the journal showing it.
    pub fn commitment(&self) -> [u8; 32] {
        Sha256::new().chain_update(COMMITMENT_DOMAIN).chain_update(self.0).finalize().into()
    }

    /// The normals of the draw at `at`.
    pub fn normals(&self, at: &Position<'_>) -> KeyedNormals {
        self.session(at.dataset, at.session).normals(at.step)
    }

    /// The draws of `session` in `dataset`: one HMAC here, then one per
    /// step keyed by the session's seed (its inner and outer pads computed
    /// once, here).
    pub fn session(&self, dataset: &str, session: &str) -> SessionDraws {
        let mut mac = hmac(&self.0);
        mac.update(DRAW_DOMAIN);
        for field in [dataset.as_bytes(), session.as_bytes()] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        let seed: [u8; 32] = mac.finalize().into_bytes().into();
        SessionDraws(hmac(&seed))
    }
}

/// HMAC-SHA256 keyed by `key` (any length is accepted: this cannot fail).
fn hmac(key: &[u8; 32]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a 32-byte key")
}

/// A session's seed, as the HMAC it keys ([`NoiseKey::session`]): as
/// secret as the key, for that session. No `Display`; a redacting `Debug`.
#[derive(Clone)]
pub struct SessionDraws(Hmac<Sha256>);

impl SessionDraws {
    /// The normals of the session's step `step` (the version it produces).
    pub fn normals(&self, step: u64) -> KeyedNormals {
        let mut mac = self.0.clone();
        mac.update(&step.to_be_bytes());
        let seed: [u8; 32] = mac.finalize().into_bytes().into();
        KeyedNormals { stream: ChaCha20Rng::from_seed(seed), spare: None }
    }
}

impl std::fmt::Debug for SessionDraws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionDraws(<redacted>)")
    }
}

impl std::fmt::Debug for NoiseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoiseKey(<redacted>)")
    }
}

/// Where a draw sits: one per release of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position<'a> {
    /// The dataset's name.
    pub dataset: &'a str,
    /// The session's store key.
    pub session: &'a str,
    /// The version the step produces (1 for a session's first step): each
    /// row of a request is a step of its own.
    pub step: u64,
}

/// The standard normals of one draw, in order.
pub struct KeyedNormals {
    stream: ChaCha20Rng,
    spare: Option<f64>,
}

impl KeyedNormals {
    /// The next standard normal.
    pub fn next_normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let mut bytes = [0u8; 16];
        self.stream.fill_bytes(&mut bytes);
        let (w1, w2) = bytes.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let (z1, z2) = box_muller(word(w1), word(w2));
        self.spare = Some(z2);
        z1
    }
}

/// Box–Muller on the top 53 bits of two words, as the module's doc says.
pub fn box_muller(w1: u64, w2: u64) -> (f64, f64) {
    const ULP: f64 = 1.0 / 9_007_199_254_740_992.0; // 2⁻⁵³
    let u1 = ((w1 >> 11) + 1) as f64 * ULP;
    let u2 = (w2 >> 11) as f64 * ULP;
    let radius = (-2.0 * libm::log(u1)).sqrt();
    let theta = std::f64::consts::TAU * u2;
    (radius * libm::cos(theta), radius * libm::sin(theta))
}

#[cfg(test)]
mod test;
