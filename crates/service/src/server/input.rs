//! Wire request → validated [`Query`], before anything else happens: a bad
//! tensor costs neither a teacher call nor budget.

use super::status::ServiceError;
use crate::proto::inference::InferTensorContents;
use crate::proto::pacpriv::PredictRequest;
use crate::session::cache::QueryDigest;
use crate::tensor;
use pacpriv_privacy::confidence;

/// What one example must look like.
#[derive(Clone, Debug)]
pub struct InputSpec {
    /// Shape of one example, e.g. `[64]`.
    pub shape: Vec<usize>,
    /// Whether `return_noisy` may be asked for (privacy.release_noisy_vector).
    pub release_noisy: bool,
    /// Most rows in one request (server.max_batch_rows).
    pub max_rows: usize,
}

/// A validated prediction request: one example, or a batch of them, each
/// a query of its own.
#[derive(Clone, Debug)]
pub struct Query {
    /// Caller's id, or one generated here.
    pub query_id: String,
    /// The examples, in order (at least one).
    pub rows: Vec<Row>,
    /// Confidence level requested, in (0, 1).
    pub alpha: Option<f64>,
    /// Return the (published) noisy release; only if the server allows it.
    pub return_noisy: bool,
}

/// One example of a request.
#[derive(Clone, Debug)]
pub struct Row {
    /// Row-major features, finite, exactly as many as the example shape holds.
    pub features: Vec<f64>,
    /// The session cache's key: the example's values.
    pub digest: QueryDigest,
}

impl Query {
    /// The id of row `i` in the journal and logs: the request's id, with
    /// `/i` after it when the request has several rows.
    pub fn row_id(&self, i: usize) -> String {
        if self.rows.len() == 1 { self.query_id.clone() } else { format!("{}/{i}", self.query_id) }
    }
}

impl InputSpec {
    /// How many rows a tensor of `shape` holds: 1 for the bare example
    /// shape, n for `[n, ...example]`; `None` if it is neither.
    fn rows_in(&self, shape: &[i64]) -> Option<usize> {
        let want = self.shape.iter().map(|&d| d as i64);
        if shape.iter().copied().eq(want.clone()) {
            return Some(1);
        }
        let (&n, example) = shape.split_first()?;
        example.iter().copied().eq(want).then(|| usize::try_from(n).ok()).flatten()
    }

    /// Validates `req` into a [`Query`].
    ///
    /// # Errors
    /// [`ServiceError::InvalidInput`] saying what to change.
    pub fn parse(&self, req: PredictRequest) -> Result<Query, ServiceError> {
        let bad = ServiceError::InvalidInput;
        if req.return_noisy && !self.release_noisy {
            return Err(ServiceError::NotReleased(
                "return_noisy: this server releases labels only (the operator setting \
                 privacy.release_noisy_vector is false); send the request without return_noisy"
                    .into(),
            ));
        }
        let query_id = if req.query_id.is_empty() { generated_id() } else { req.query_id };
        if query_id.len() > 128 {
            return Err(bad("query_id is longer than 128 bytes".into()));
        }
        let Some(t) = req.input else {
            return Err(bad(format!("input is missing: send a tensor of shape {:?} (FP32 or FP64)", self.shape)));
        };
        let n = match self.rows_in(&t.shape) {
            Some(0) => return Err(bad("input has no rows: send at least one example".into())),
            Some(n) if n > self.max_rows => {
                return Err(bad(format!(
                    "input has {n} rows; this server answers at most {} in one request (server.max_batch_rows): \
                     split the batch",
                    self.max_rows
                )));
            }
            Some(n) => n,
            None => {
                return Err(bad(format!(
                    "input shape {:?} is not accepted: this model takes examples of shape {:?}, one as it is \
                     or n as [n, ...]",
                    t.shape, self.shape
                )));
            }
        };
        let contents = InferTensorContents {
            fp32_contents: t.fp32_contents,
            fp64_contents: t.fp64_contents,
            ..Default::default()
        };
        let raw = (!t.raw_contents.is_empty()).then_some(t.raw_contents.as_slice());
        let features = tensor::decode_floats(&t.datatype, &t.shape, Some(&contents), raw)
            .map_err(|e| bad(format!("input: {e}")))?;
        let alpha = match req.confidence_alpha {
            Some(a) => {
                confidence::threshold(a).map_err(|_| bad(format!("confidence_alpha must be in (0, 1), got {a}")))?;
                Some(a)
            }
            None => None,
        };
        let width = features.len() / n;
        let rows = features
            .chunks_exact(width)
            .map(|example| Row { features: example.to_vec(), digest: QueryDigest::of(example) })
            .collect();
        Ok(Query { query_id, rows, alpha, return_noisy: req.return_noisy })
    }
}

/// A random id for requests that did not bring one (for log correlation).
fn generated_id() -> String {
    use rand::RngExt;
    format!("q-{:016x}", rand::rng().random::<u64>())
}
