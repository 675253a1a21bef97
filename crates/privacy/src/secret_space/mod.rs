//! The secret space 𝒮 = {S_0, …, S_{M−1}}: which of the N points of the
//! universe U each subset (one teacher's training set) holds (paper §4.2.1).
//!
//! # Paper
//!
//! For each point u ∈ U, independently, M/2 of the M subset indices are drawn
//! uniformly without replacement and u is put into those subsets. Every point
//! is then in exactly M/2 subsets, so under the uniform prior over 𝒮 its
//! membership probability is exactly ½: the 50 % prior success rate that the
//! MIA bound of Eq. 2 ([`super::report`]) is measured against. Each S_i holds
//! about N/2 points (Binomial(N, ½)).
//!
//! # Owns
//!
//! [`Assignment`]: the checked assignment, its generation, and its file
//! format. The assignment is public (the paper's adversary knows 𝒮), so any
//! [`rand::Rng`] will do; only the choice of the serving subset s* must be
//! secret, and that lives elsewhere.
//!
//! # Invariants
//!
//! - M is even and ≥ 2, N ≥ 1.
//! - Every point is in exactly M/2 distinct subsets; every constructor,
//!   including deserialization, checks this.
//!
//! # File format (`pacpriv-subsets/v1`, JSON)
//!
//! ```json
//! {"format":"pacpriv-subsets/v1","n":4,"m":2,"seed":7,"subsets":[[0,3],[1,2]]}
//! ```
//!
//! - `format`: exactly `"pacpriv-subsets/v1"`.
//! - `n`, `m`: the number of points and of subsets.
//! - `seed` (optional, u64): the seed of [`Assignment::from_seed`]. It
//!   documents provenance; the `subsets` lists are authoritative (another
//!   `rand` version may draw differently from the same seed).
//! - `subsets`: M lists; list i holds the point indices of S_i, strictly
//!   increasing, each < N.
//!
//! Unknown fields are rejected.

use super::PrivacyError;
use rand::SeedableRng;
use serde::{Deserialize, Serialize, Serializer};

/// The value of the `format` field.
pub const FORMAT: &str = "pacpriv-subsets/v1";

/// For N points and M subsets, the M/2 subsets that contain each point.
///
/// Stored point-major (the way it is generated and how the attack of
/// Prop. 6.1 reads it); serialized subset-major (how teachers are trained).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "AssignmentFile")]
pub struct Assignment {
    n: usize,
    m: usize,
    /// Provenance only, see the file format.
    seed: Option<u64>,
    /// Point u's subsets, sorted, at `[u·M/2, (u+1)·M/2)`.
    subsets_by_point: Vec<usize>,
}

impl Assignment {
    /// Draws an assignment: for each of the `n` points independently, `m/2`
    /// of the `m` subset indices uniformly without replacement (§4.2.1).
    ///
    /// # Arguments
    /// - `n`: points in the universe U.
    /// - `m`: subsets (teachers); even and ≥ 2.
    /// - `rng`: any generator: the assignment is public.
    ///
    /// # Errors
    /// [`PrivacyError::Domain`] if `m` is odd or < 2, `n` is 0, or n·m/2
    /// does not fit in memory addresses.
    ///
    /// # Runtime
    /// O(n·m log m) time, n·m/2 indices of memory.
    pub fn generate(n: usize, m: usize, rng: &mut impl rand::Rng) -> Result<Self, PrivacyError> {
        let half = check_shape(n, m)?;
        let mut subsets_by_point = Vec::with_capacity(entries(n, half)?);
        for _ in 0..n {
            let mut chosen = rand::seq::index::sample(rng, m, half).into_vec();
            chosen.sort_unstable();
            subsets_by_point.extend_from_slice(&chosen);
        }
        Ok(Assignment { n, m, seed: None, subsets_by_point })
    }

    /// [`Assignment::generate`] with a `ChaCha20Rng::seed_from_u64(seed)`,
    /// recording `seed` in the file.
    ///
    /// # Errors
    /// As [`Assignment::generate`].
    pub fn from_seed(n: usize, m: usize, seed: u64) -> Result<Self, PrivacyError> {
        let mut rng = chacha20::ChaCha20Rng::seed_from_u64(seed);
        let assignment = Assignment::generate(n, m, &mut rng)?;
        Ok(Assignment { seed: Some(seed), ..assignment })
    }

    /// Number of points N.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of subsets M.
    pub fn m(&self) -> usize {
        self.m
    }

    /// The seed this assignment was drawn from, if recorded.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// The M/2 subsets that contain `point`, sorted.
    ///
    /// # Panics
    /// If `point ≥ n`, like slice indexing.
    pub fn subsets_of_point(&self, point: usize) -> &[usize] {
        let half = self.m / 2;
        &self.subsets_by_point[point * half..(point + 1) * half]
    }

    /// Whether S_`subset` contains `point`. A subset index ≥ M contains
    /// nothing.
    ///
    /// # Panics
    /// If `point ≥ n`.
    pub fn contains(&self, subset: usize, point: usize) -> bool {
        self.subsets_of_point(point).binary_search(&subset).is_ok()
    }

    /// The points of S_`subset`, sorted; empty if `subset ≥ m`.
    ///
    /// # Runtime
    /// O(n log m): the assignment is stored by point.
    pub fn members_of_subset(&self, subset: usize) -> Vec<usize> {
        (0..self.n).filter(|&point| self.contains(subset, point)).collect()
    }
}

/// M/2, after checking the shape.
fn check_shape(n: usize, m: usize) -> Result<usize, PrivacyError> {
    if m < 2 || !m.is_multiple_of(2) {
        return Err(PrivacyError::Domain(format!(
            "the number of subsets m must be even and at least 2 (every point goes into \
             exactly m/2 of them), got m = {m}"
        )));
    }
    if n == 0 {
        return Err(PrivacyError::Domain("the number of points n must be at least 1, got n = 0".to_owned()));
    }
    Ok(m / 2)
}

/// n·m/2, the number of stored indices.
fn entries(n: usize, half: usize) -> Result<usize, PrivacyError> {
    n.checked_mul(half)
        .ok_or_else(|| PrivacyError::Domain(format!("n = {n} points × m/2 = {half} subsets each is too large")))
}

/// The JSON form, see the module docs.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignmentFile {
    format: String,
    n: usize,
    m: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    subsets: Vec<Vec<usize>>,
}

impl From<&Assignment> for AssignmentFile {
    fn from(a: &Assignment) -> Self {
        let mut subsets = vec![Vec::with_capacity(a.n / 2 + 1); a.m];
        // Points in increasing order, so every list comes out sorted.
        for point in 0..a.n {
            for &subset in a.subsets_of_point(point) {
                subsets[subset].push(point);
            }
        }
        AssignmentFile { format: FORMAT.to_owned(), n: a.n, m: a.m, seed: a.seed, subsets }
    }
}

impl TryFrom<AssignmentFile> for Assignment {
    type Error = PrivacyError;

    /// Checks the format tag, the shape and the exact-half property.
    fn try_from(file: AssignmentFile) -> Result<Self, PrivacyError> {
        let bad = |why: String| PrivacyError::Domain(format!("invalid {FORMAT} file: {why}"));
        if file.format != FORMAT {
            return Err(bad(format!("format is {:?}, expected {FORMAT:?}", file.format)));
        }
        let (n, m) = (file.n, file.m);
        let half = check_shape(n, m).map_err(|e| bad(e.to_string()))?;
        if file.subsets.len() != m {
            return Err(bad(format!("m = {m} but {} subsets are listed", file.subsets.len())));
        }
        // Check the total before allocating n·m/2 entries a short file could ask for.
        let expected = entries(n, half).map_err(|e| bad(e.to_string()))?;
        let listed: usize = file.subsets.iter().map(Vec::len).sum();
        if listed != expected {
            return Err(bad(format!(
                "the subsets list {listed} memberships, but n·m/2 = {expected} \
                 (every point in exactly m/2 = {half} subsets)"
            )));
        }
        let mut subsets_by_point = vec![0; expected];
        let mut filled = vec![0usize; n];
        for (subset, points) in file.subsets.iter().enumerate() {
            if let Some(pair) = points.windows(2).find(|pair| pair[0] >= pair[1]) {
                return Err(bad(format!("subset {subset} is not strictly increasing ({} then {})", pair[0], pair[1])));
            }
            for &point in points {
                let count = filled
                    .get_mut(point)
                    .ok_or_else(|| bad(format!("subset {subset} lists point {point}, but n = {n}")))?;
                if *count == half {
                    return Err(bad(format!("point {point} is in more than m/2 = {half} subsets")));
                }
                // Subsets are visited in increasing order: each point's list stays sorted.
                subsets_by_point[point * half + *count] = subset;
                *count += 1;
            }
        }
        if let Some(point) = filled.iter().position(|&count| count != half) {
            return Err(bad(format!("point {point} is in {} subsets, expected exactly m/2 = {half}", filled[point])));
        }
        Ok(Assignment { n, m, seed: file.seed, subsets_by_point })
    }
}

/// Writes the `pacpriv-subsets/v1` JSON form (module docs).
impl Serialize for Assignment {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        AssignmentFile::from(self).serialize(serializer)
    }
}

#[cfg(test)]
mod test;
