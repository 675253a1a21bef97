//! One query of a request: what it asks ([`Asking`]) and what it gets
//! back ([`Reply`]), fresh from a step or again from the cache.

use super::cache::{CacheKey, Cached};
use super::error::SessionError;
use pacpriv_privacy::Nats;
use pacpriv_privacy::mechanism::Answer;
use pacpriv_store::Release;

/// One query as its session sees it.
#[derive(Clone, Debug)]
pub struct Asking {
    /// Confidence level asked for.
    pub alpha: Option<f64>,
    /// The client's id (journal).
    pub query_id: String,
    /// The query's cache key; `None`: never cached (internal callers).
    pub key: Option<CacheKey>,
    /// Whether the noisy vector will be returned (it is kept with the
    /// cached answer only then).
    pub return_noisy: bool,
    /// The model asked and its version, as the journal records them
    /// (empty: internal callers, which name none).
    pub model: ModelTag,
}

/// A private model's name and version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelTag {
    /// The model's name.
    pub name: std::sync::Arc<str>,
    /// Its version.
    pub version: std::sync::Arc<str>,
}

impl Asking {
    /// A query that is neither looked up nor kept in the cache.
    pub fn uncached(alpha: Option<f64>, query_id: String) -> Asking {
        Asking { alpha, query_id, key: None, return_noisy: false, model: ModelTag::default() }
    }
}

/// What a query released: a fresh answer, or the cached one again.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The released label.
    pub label: usize,
    /// Whether the teachers were unanimous.
    pub unanimous: bool,
    /// MI charged for this reply (zero when cached).
    pub charge: Nats,
    /// Prop. 5.1 at the requested α, if one was requested (label mode).
    pub confident: Option<bool>,
    /// The published noisy vector (sent only on request).
    pub published: Vec<f64>,
    /// Whether this is an earlier answer returned again.
    pub cached: bool,
}

impl Reply {
    /// When this reply may leave (`docs/assurance/accounting.md` §5).
    /// `unanimous_free`: the policy charges unanimous answers nothing.
    /// An exact unanimous answer leaves at once when neither it nor the
    /// step that produced it was charged — it says nothing about the
    /// secret and moved no posterior; a cached answer whose step was
    /// charged (noisy, or unanimous under `paper`) once the session's
    /// charges are durable; a charged one once its own charge is.
    pub(super) fn release(&self, unanimous_free: bool) -> Release {
        match (self.unanimous, self.cached) {
            (true, _) if unanimous_free && self.charge.get() == 0.0 => Release::Free,
            (_, true) => Release::AfterCharges,
            _ => Release::Durable,
        }
    }

    pub(super) fn fresh(a: Answer) -> Reply {
        Reply {
            label: a.label,
            unanimous: a.unanimous,
            charge: a.charge,
            confident: a.confident,
            published: a.published,
            cached: false,
        }
    }

    /// `c` again, with the flag at the α this repeat asks for.
    pub(super) fn cached(c: &Cached, asking: &Asking) -> Result<Reply, SessionError> {
        if asking.return_noisy && c.published.is_none() {
            return Err(SessionError::NoisyNotKept);
        }
        let confident = match (asking.alpha, c.evidence) {
            (Some(a), Some(e)) => Some(e.confident(a)?),
            _ => None,
        };
        Ok(Reply {
            label: c.label,
            unanimous: c.unanimous,
            charge: Nats::ZERO,
            confident,
            published: c.published.clone().unwrap_or_default(),
            cached: true,
        })
    }
}
