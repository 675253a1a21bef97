//! Safe wrappers for the two BLAS/LAPACK routines the privacy core needs
//! and ndarray-linalg does not expose (issue 56 §1):
//!
//! - [`gram`]: A·Aᵀ or Aᵀ·A by BLAS `dsyrk`, which computes one triangle
//!   of the symmetric result: half the flops of the general product that
//!   ndarray's `dot` runs.
//! - [`eigh`]: the eigendecomposition of a symmetric matrix by LAPACK
//!   `dsyevd` (divide and conquer; numpy's `eigh`), faster on the privacy
//!   core's 100–128-wide matrices than ndarray-linalg's `eigh` (`dsyev`,
//!   QR iteration) and than `gesdd` on the same matrix.
//!
//! # Invariants
//!
//! This is the workspace's one crate with `unsafe` code, and it holds
//! nothing else. Each unsafe block is a single FFI call. The function
//! around it establishes everything the routine reads before the call:
//! dimensions that fit a C `int`, leading dimensions ≥ 1, and buffers of
//! exactly the length the routine indexes, owned and contiguous (and, for
//! `dsyevd`, finite input: NaN would be its to handle; `dsyrk` just
//! propagates it). After the call it reads only what the routine wrote.
//! Nothing borrowed outlives the call.
//!
//! Both calls assume an LP64 OpenBLAS (32-bit `int`), Debian's
//! `libopenblas-dev`; an ILP64 build would need `i64` sizes, and
//! [`check_lp64`] refuses one (the server and `pacpriv verify` run it
//! first). Every buffer size is computed with checked arithmetic. `dsyevd_` is
//! declared here with the two hidden lengths of its character arguments
//! that gfortran-compiled LAPACK expects, rather than through a binding
//! that omits them.
//!
//! The privacy core does not trust either result: the basis it builds from
//! them is checked to be orthonormal and every quadratic form is recomputed
//! from the outputs (`pacpriv_privacy::noise::Orthonormal`), so a wrong
//! answer here costs noise or time, never the certificate.

use ndarray::{Array1, Array2, ArrayView2, ShapeBuilder};
use std::ffi::{c_char, c_int};

// Links the system OpenBLAS, which provides both the CBLAS and the LAPACK symbols.
use openblas_src as _;

/// What the wrappers refuse.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// The input's shape is not one the routine takes.
    #[error("{0}")]
    Shape(String),
    /// The input holds a NaN or an infinity.
    #[error("the matrix has NaN or infinite entries")]
    NonFinite,
    /// LAPACK reported a failure (`info` ≠ 0: < 0 names a bad argument,
    /// > 0 that the algorithm did not converge).
    #[error("LAPACK {routine} failed (info = {info})")]
    Lapack {
        /// The routine.
        routine: &'static str,
        /// Its `info` output.
        info: i32,
    },
}

/// Which Gram matrix of an n × k matrix A [`gram`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// A·Aᵀ, n × n: the inner products of A's rows.
    Rows,
    /// Aᵀ·A, k × k: the inner products of A's columns.
    Columns,
}

/// A·Aᵀ or Aᵀ·A (per `side`), exactly symmetric: BLAS `dsyrk` computes
/// the upper triangle and it is mirrored.
///
/// # Errors
/// [`Error::Shape`] if a dimension does not fit a C `int`.
pub fn gram(a: ArrayView2<'_, f64>, side: Side) -> Result<Array2<f64>, Error> {
    let (rows, cols) = a.dim();
    let (n, k) = match side {
        Side::Rows => (rows, cols),
        Side::Columns => (cols, rows),
    };
    if n == 0 || k == 0 {
        return Ok(Array2::zeros((n, n)));
    }
    // Row-major and contiguous: the only layout handed to BLAS below.
    let a = a.as_standard_layout();
    let a = a.as_slice().ok_or_else(|| Error::Shape("matrix is not contiguous".into()))?;
    let mut c = vec![0.0; n.checked_mul(n).ok_or_else(|| too_large(n))?];
    let (n_c, k_c, lda) = (int(n)?, int(k)?, int(cols)?);
    let trans = match side {
        // C = A·Aᵀ with A n × k, lda = k.
        Side::Rows => cblas_sys::CBLAS_TRANSPOSE::CblasNoTrans,
        // C = Aᵀ·A with A k × n as stored (rows × cols = k × n), lda = n = cols.
        Side::Columns => cblas_sys::CBLAS_TRANSPOSE::CblasTrans,
    };
    // SAFETY: `a` is a contiguous row-major rows × cols buffer (lda = cols ≥ 1);
    // with NoTrans dsyrk reads n × k = rows × cols of it, with Trans k × n =
    // rows × cols. `c` is an owned n × n buffer (ldc = n ≥ 1), of which dsyrk
    // writes the upper triangle (beta = 0: nothing is read). Both outlive the call.
    unsafe {
        cblas_sys::cblas_dsyrk(
            cblas_sys::CBLAS_LAYOUT::CblasRowMajor,
            cblas_sys::CBLAS_UPLO::CblasUpper,
            trans,
            n_c,
            k_c,
            1.0,
            a.as_ptr(),
            lda,
            0.0,
            c.as_mut_ptr(),
            n_c,
        );
    }
    for i in 0..n {
        for j in 0..i {
            c[i * n + j] = c[j * n + i];
        }
    }
    Array2::from_shape_vec((n, n), c).map_err(|e| Error::Shape(e.to_string()))
}

/// Checks that the linked OpenBLAS takes 32-bit integers (LP64), as both
/// wrappers declare: an ILP64 build (`USE64BITINT` in its configuration)
/// would read each size as half of a 64-bit one. Callers run it once at
/// start and refuse to go on otherwise.
///
/// # Errors
/// [`Error::Shape`] naming the library's configuration when it is ILP64.
pub fn check_lp64() -> Result<(), Error> {
    // SAFETY: openblas_get_config takes nothing and returns a pointer to a
    // static NUL-terminated string owned by the library (never freed),
    // read here before anything else could call into it.
    let config = unsafe { std::ffi::CStr::from_ptr(openblas_get_config()) }.to_string_lossy().into_owned();
    if config.contains("USE64BITINT") {
        return Err(Error::Shape(format!(
            "the linked OpenBLAS is built with 64-bit integers (ILP64: \"{config}\"); pacpriv calls BLAS/LAPACK \
             with 32-bit ones: install an LP64 build (Debian's libopenblas-dev; libopenblas64-dev is ILP64)"
        )));
    }
    Ok(())
}

/// The eigendecomposition of a symmetric matrix A = V·diag(λ)·Vᵀ.
#[derive(Clone, Debug)]
pub struct Eigh {
    /// λ in ascending order (LAPACK's).
    pub values: Array1<f64>,
    /// V: column j is the unit eigenvector for `values[j]`.
    pub vectors: Array2<f64>,
}

/// The eigendecomposition of the symmetric matrix `a` by LAPACK `dsyevd`.
///
/// # Errors
/// [`Error::Shape`] if `a` is not square or not exactly symmetric, or too
/// large for LAPACK's `int` workspace sizes; [`Error::NonFinite`] for NaN
/// or ∞ entries; [`Error::Lapack`] if the algorithm fails to converge.
pub fn eigh(a: ArrayView2<'_, f64>) -> Result<Eigh, Error> {
    let (n, cols) = a.dim();
    if n != cols {
        return Err(Error::Shape(format!("eigh needs a square matrix, not {n} × {cols}")));
    }
    if a.iter().any(|x| !x.is_finite()) {
        return Err(Error::NonFinite);
    }
    if (0..n).any(|i| (0..i).any(|j| a[[i, j]] != a[[j, i]])) {
        return Err(Error::Shape("eigh needs a symmetric matrix".into()));
    }
    if n == 0 {
        return Ok(Eigh { values: Array1::zeros(0), vectors: Array2::zeros((0, 0)) });
    }
    // Row-major order; A is symmetric, so this is also A in LAPACK's column-major order.
    let mut buf: Vec<f64> = a.iter().copied().collect();
    let mut values = vec![0.0; n];
    // dsyevd's minimal workspaces for JOBZ = 'V' (n ≥ 2; n = 1 needs 1 each).
    let lwork = n
        .checked_mul(n)
        .and_then(|nn| nn.checked_mul(2))
        .and_then(|x| n.checked_mul(6).and_then(|six| x.checked_add(six)))
        .and_then(|x| x.checked_add(1))
        .ok_or_else(|| too_large(n))?;
    let liwork = n.checked_mul(5).and_then(|x| x.checked_add(3)).ok_or_else(|| too_large(n))?;
    let mut work = vec![0.0; lwork];
    let mut iwork: Vec<c_int> = vec![0; liwork];
    let (n_c, lwork_c, liwork_c) = (int(n)?, int(lwork)?, int(liwork)?);
    let mut info: c_int = 0;
    // SAFETY: every pointer is to an owned buffer of the length dsyevd indexes:
    // A n × n with lda = n ≥ 1, W n, WORK lwork and IWORK liwork, both at least
    // the documented minimum for JOBZ = 'V' (1 + 6n + 2n², 3 + 5n); the
    // scalars are locals, and the two character arguments are one byte each
    // (their hidden lengths). All outlive the call.
    unsafe {
        dsyevd_(
            &(b'V' as c_char),
            &(b'U' as c_char),
            &n_c,
            buf.as_mut_ptr(),
            &n_c,
            values.as_mut_ptr(),
            work.as_mut_ptr(),
            &lwork_c,
            iwork.as_mut_ptr(),
            &liwork_c,
            &mut info,
            1,
            1,
        );
    }
    if info != 0 {
        return Err(Error::Lapack { routine: "dsyevd", info });
    }
    // LAPACK returns the eigenvectors as the columns of a column-major matrix.
    let vectors = Array2::from_shape_vec((n, n).f(), buf).map_err(|e| Error::Shape(e.to_string()))?;
    Ok(Eigh { values: Array1::from(values), vectors })
}

// LAPACK's Fortran interface, with the hidden lengths of JOBZ and UPLO
// that gfortran passes after the other arguments (size_t each); and
// OpenBLAS's description of its own build.
unsafe extern "C" {
    fn openblas_get_config() -> *const c_char;

    fn dsyevd_(
        jobz: *const c_char,
        uplo: *const c_char,
        n: *const c_int,
        a: *mut f64,
        lda: *const c_int,
        w: *mut f64,
        work: *mut f64,
        lwork: *const c_int,
        iwork: *mut c_int,
        liwork: *const c_int,
        info: *mut c_int,
        jobz_len: usize,
        uplo_len: usize,
    );
}

fn int(x: usize) -> Result<c_int, Error> {
    c_int::try_from(x).map_err(|_| too_large(x))
}

fn too_large(n: usize) -> Error {
    Error::Shape(format!("a dimension of {n} is too large for BLAS/LAPACK's int sizes"))
}

#[cfg(test)]
mod test;
