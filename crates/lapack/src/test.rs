use super::*;
use ndarray::{Array2, array};
use ndarray_linalg::{Eigh as _, UPLO};
use proptest::prelude::*;

/// A deterministic n × k matrix with entries in [-1, 1) from `seed`.
fn matrix(n: usize, k: usize, seed: u64) -> Array2<f64> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    Array2::from_shape_fn((n, k), |_| {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    })
}

fn max_abs(a: &Array2<f64>) -> f64 {
    a.iter().fold(0.0, |m, x| f64::max(m, x.abs()))
}

proptest! {
    #[test]
    fn gram_is_the_product_and_exactly_symmetric(n in 0usize..40, k in 0usize..40, seed in any::<u64>(), transposed in any::<bool>()) {
        let owned = matrix(n, k, seed);
        // A view that is not row-major exercises the copy to standard layout.
        let stored = if transposed { owned.t().to_owned() } else { owned.clone() };
        let a = if transposed { stored.t() } else { stored.view() };
        for (side, want) in [(Side::Rows, a.dot(&a.t())), (Side::Columns, a.t().dot(&a))] {
            let g = gram(a, side).expect("gram");
            prop_assert_eq!(g.dim(), want.dim());
            prop_assert!(max_abs(&(&g - &want)) <= 1e-13 * (n.max(k) as f64 + 1.0));
            prop_assert!(g == g.t());
        }
    }

    #[test]
    fn eigh_reconstructs_a_symmetric_matrix_with_orthonormal_vectors(n in 0usize..48, seed in any::<u64>()) {
        let b = matrix(n, n, seed);
        let a = &b + &b.t();
        let e = eigh(a.view()).expect("eigh");
        prop_assert!(e.values.windows(2).into_iter().all(|w| w[0] <= w[1]), "ascending");
        let v = &e.vectors;
        let scale = max_abs(&a).max(1.0) * (n as f64 + 1.0);
        prop_assert!(max_abs(&(v.t().dot(v) - Array2::<f64>::eye(n))) <= 1e-13 * (n as f64 + 1.0));
        let rebuilt = (v * &e.values.view().insert_axis(ndarray::Axis(0))).dot(&v.t());
        prop_assert!(max_abs(&(&rebuilt - &a)) <= 1e-13 * scale);
        if n > 0 {
            // The same spectrum as ndarray-linalg's dsyev.
            let (reference, _) = a.eigh(UPLO::Upper).expect("dsyev");
            prop_assert!(e.values.iter().zip(&reference).all(|(x, y)| (x - y).abs() <= 1e-12 * scale));
        }
    }
}

#[test]
fn eigh_of_a_known_matrix() {
    let e = eigh(array![[2.0, 1.0], [1.0, 2.0]].view()).expect("eigh");
    assert!((e.values[0] - 1.0).abs() < 1e-15 && (e.values[1] - 3.0).abs() < 1e-15);
    let h = std::f64::consts::FRAC_1_SQRT_2;
    // The eigenvector of 3 is ±(1, 1)/√2.
    assert!((e.vectors[[0, 1]].abs() - h).abs() < 1e-15 && e.vectors[[0, 1]] == e.vectors[[1, 1]]);
    let one = eigh(array![[5.0]].view()).expect("1 × 1");
    assert_eq!((one.values[0], one.vectors[[0, 0]].abs()), (5.0, 1.0));
}

#[test]
fn eigh_refuses_what_dsyevd_cannot_take() {
    assert!(matches!(eigh(Array2::zeros((2, 3)).view()), Err(Error::Shape(_))));
    assert!(matches!(eigh(array![[1.0, 2.0], [2.5, 1.0]].view()), Err(Error::Shape(_))));
    assert_eq!(eigh(array![[1.0, f64::NAN], [f64::NAN, 1.0]].view()).err(), Some(Error::NonFinite));
    assert_eq!(eigh(array![[f64::INFINITY]].view()).err(), Some(Error::NonFinite));
}

/// The machine's OpenBLAS (Debian's libopenblas-dev) is LP64: what both
/// wrappers declare, and what the server checks at start.
#[test]
fn the_linked_openblas_is_lp64() {
    assert_eq!(check_lp64(), Ok(()));
}
