//! Wire request → validated [`Query`], before anything else happens: a bad
//! tensor costs neither a teacher call nor budget.

use super::status::ServiceError;
use crate::privacy::confidence;
use crate::proto::inference::InferTensorContents;
use crate::proto::pacpriv::PredictRequest;
use crate::session::cache::QueryDigest;
use crate::tensor;

/// What one example must look like.
#[derive(Clone, Debug)]
pub struct InputSpec {
    /// Shape of one example, e.g. `[64]`.
    pub shape: Vec<usize>,
    /// Whether `return_noisy` may be asked for (privacy.release_noisy_vector).
    pub release_noisy: bool,
}

/// A validated prediction request.
#[derive(Clone, Debug)]
pub struct Query {
    /// Caller's id, or one generated here.
    pub query_id: String,
    /// Row-major features, finite, exactly as many as the shape holds.
    pub features: Vec<f64>,
    /// Confidence level requested, in (0, 1).
    pub alpha: Option<f64>,
    /// Return the (published) noisy release; only if the server allows it.
    pub return_noisy: bool,
    /// The session cache's key: the example's values.
    pub digest: QueryDigest,
}

impl InputSpec {
    fn accepts(&self, shape: &[i64]) -> bool {
        let want = self.shape.iter().map(|&d| d as i64);
        // The example itself, or a batch of exactly one.
        shape.iter().copied().eq(want.clone()) || (shape.first() == Some(&1) && shape[1..].iter().copied().eq(want))
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
        if !self.accepts(&t.shape) {
            return Err(bad(format!(
                "input shape {:?} is not accepted: this model takes one example of shape {:?} (or [1, ...])",
                t.shape, self.shape
            )));
        }
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
        let digest = QueryDigest::of(&features);
        Ok(Query { query_id, features, alpha, return_noisy: req.return_noisy, digest })
    }
}

/// A random id for requests that did not bring one (for log correlation).
fn generated_id() -> String {
    use rand::RngExt;
    format!("q-{:016x}", rand::rng().random::<u64>())
}
