use super::*;
use crate::noise::{Noise, Orthonormal};
use crate::{Nats, PrivacyError, label, posterior::Posterior};
use ndarray::Array2;
use statrs::distribution::{ChiSquared, ContinuousCDF};

fn key(byte: u8) -> NoiseKey {
    NoiseKey::from_bytes([byte; 32])
}

fn at(dataset: &str, session: &str, step: u64) -> Position<'static> {
    // Leaked: a handful of short strings, tests only.
    Position { dataset: Box::leak(dataset.into()), session: Box::leak(session.into()), step }
}

/// The stream is RFC 8439's ChaCha20 keystream (nonce 0, counter 0): test
/// vector A.1 #1, the all-zero key.
#[test]
fn the_stream_is_rfc_8439_chacha20() {
    let mut stream = ChaCha20Rng::from_seed([0; 32]);
    let mut bytes = [0u8; 16];
    stream.fill_bytes(&mut bytes);
    assert_eq!(bytes, [0x76, 0xb8, 0xe0, 0xad, 0xa0, 0xf1, 0x3d, 0x90, 0x40, 0x5d, 0x6a, 0xe5, 0x53, 0x86, 0xbd, 0x28]);
}

/// The draw at one position, bit for bit: what an auditor's own
/// implementation of the module's recipe must reproduce (the verify chapter
/// prints these values).
#[test]
fn a_draw_is_pinned_bit_for_bit() {
    let mut normals = key(7).normals(&at("default", "alice", 1));
    let bits: Vec<u64> = (0..4).map(|_| normals.next_normal().to_bits()).collect();
    assert_eq!(bits, GOLDEN, "{:?}", bits.iter().map(|b| f64::from_bits(*b)).collect::<Vec<_>>());
}

const GOLDEN: [u64; 4] = [4607747549659993849, 4601435125465437891, 4596605843166443656, 13828620913238737390];

/// A session's draws are its key's at each position: the seed once, the
/// step as the stream's nonce.
#[test]
fn a_sessions_draws_are_the_positions() {
    let k = key(4);
    let session = k.session("default", "alice");
    for step in [0, 1, 2, u64::MAX] {
        let (mut a, mut b) = (session.normals(step), k.normals(&at("default", "alice", step)));
        for _ in 0..9 {
            assert_eq!(a.next_normal().to_bits(), b.next_normal().to_bits());
        }
    }
    assert_eq!(format!("{session:?}"), "SessionDraws(<redacted>)");
}

#[test]
fn every_field_of_the_position_and_the_key_changes_the_draw() {
    let first = |k: &NoiseKey, p: Position<'_>| k.normals(&p).next_normal().to_bits();
    let base = first(&key(1), at("default", "alice", 7));
    for other in [
        first(&key(2), at("default", "alice", 7)),
        first(&key(1), at("fashion", "alice", 7)),
        first(&key(1), at("default", "bob", 7)),
        first(&key(1), at("default", "alice", 8)),
        // Lengths are encoded: fields cannot trade bytes.
        first(&key(1), at("defaul", "talice", 7)),
    ] {
        assert_ne!(other, base);
    }
    assert_eq!(first(&key(1), at("default", "alice", 7)), base, "a function of key and position alone");
}

#[test]
fn the_commitment_binds_the_key_and_the_key_is_never_printed() {
    assert_ne!(key(1).commitment(), key(2).commitment());
    assert_eq!(key(1).commitment(), key(1).commitment());
    assert_eq!(format!("{:?}", key(1)), "NoiseKey(<redacted>)");
}

/// Box–Muller's extremes: u₁ = 2⁻⁵³ gives the largest radius, u₁ = 1 zero.
#[test]
fn box_muller_is_finite_at_its_extremes() {
    let (a, b) = box_muller(0, 0);
    assert!((a - (-2.0 * (2f64.powi(-53)).ln()).sqrt()).abs() < 1e-12 && b == 0.0, "{a} {b}");
    let (a, b) = box_muller(u64::MAX, u64::MAX);
    assert!(a == 0.0 && b.abs() == 0.0, "{a} {b}");
}

/// A χ² goodness-of-fit test of `values` against `dist`, in 20
/// equiprobable bins: the p-value of the statistic on 19 degrees of freedom.
fn fit(values: &[f64], dist: &ChiSquared) -> f64 {
    let bins = 20;
    let edges: Vec<f64> = (1..bins).map(|i| dist.inverse_cdf(i as f64 / bins as f64)).collect();
    let mut counts = vec![0usize; bins];
    for v in values {
        counts[edges.partition_point(|e| e < v)] += 1;
    }
    let expected = values.len() as f64 / bins as f64;
    let stat: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    1.0 - ChiSquared::new((bins - 1) as f64).expect("dof").cdf(stat)
}

/// ‖g‖² of n keyed normals is χ² on n degrees of freedom, for every block
/// size the service draws (label mode's k active classes, vector mode's d):
/// each of 2 000 draws at its own position.
#[test]
fn keyed_normals_are_standard_normal_in_every_dimension_used() {
    let k = key(3);
    for n in [1usize, 2, 3, 4, 10, 100, 1000] {
        let norms: Vec<f64> = (0..2000)
            .map(|step| {
                let mut g = k.normals(&at("default", "chi", step));
                (0..n).map(|_| g.next_normal().powi(2)).sum()
            })
            .collect();
        let p = fit(&norms, &ChiSquared::new(n as f64).expect("dof"));
        assert!(p > 1e-6, "n = {n}: p = {p:e}");
    }
    // And one long stream: its coordinates one at a time (χ² on 1).
    let mut g = k.normals(&at("default", "long", 1));
    let squares: Vec<f64> = (0..20_000).map(|_| g.next_normal().powi(2)).collect();
    let p = fit(&squares, &ChiSquared::new(1.0).expect("dof"));
    assert!(p > 1e-6, "one stream: p = {p:e}");
}

/// Noise drawn from keyed normals is N(0, Σ): its whitened coefficients and
/// its complement are χ² on r and n − r (label mode k = 4; a 6-dim block
/// with a 2-dim basis and a complement).
#[test]
fn keyed_draws_whiten_to_chi_square() -> Result<(), PrivacyError> {
    let b = Nats::new(2f64.powi(-8))?;
    let cal = label::calibrate(&Posterior::uniform(8)?, &[0, 1, 2, 3, 0, 1, 2, 0], 5, b)?;
    let mut u = Array2::zeros((6, 2));
    u[[0, 0]] = 1.0;
    u[[1, 1]] = std::f64::consts::FRAC_1_SQRT_2;
    u[[2, 1]] = std::f64::consts::FRAC_1_SQRT_2;
    let vector = Noise::certified(6, (0..6).collect(), Orthonormal::check(u)?, &[0.5, 0.25], 0.1, b)?;
    let k = key(9);
    for (name, noise) in [("label", cal.noise()), ("vector", &vector)] {
        let (mut main, mut rest) = (Vec::new(), Vec::new());
        for step in 0..2000 {
            let mut g = k.normals(&at(name, "whiten", step));
            let draw = noise.sample_from(|| g.next_normal());
            main.push(draw.std_coef.iter().map(|c| c * c).sum::<f64>());
            if noise.complement() > 0.0 {
                rest.push(draw.residual.iter().map(|z| z * z).sum::<f64>() / noise.complement());
            }
        }
        let p = fit(&main, &ChiSquared::new(noise.rank() as f64).expect("dof"));
        assert!(p > 1e-6, "{name}: coefficients p = {p:e}");
        if !rest.is_empty() {
            let n = noise.coords().len() - noise.rank();
            let p = fit(&rest, &ChiSquared::new(n as f64).expect("dof"));
            assert!(p > 1e-6, "{name}: complement p = {p:e}");
        }
    }
    Ok(())
}
