//! An authenticated [`Caller`]: its principal, what it presented, and the
//! [`Handle`] on the session it is charged to in each dataset.
//!
//! # Invariants
//! - A caller has one handle per dataset, in the registry's dataset order
//!   (the default dataset first); which one a request steps is chosen by
//!   the model it names, which is public.

use super::credential::Presented;
use super::error::SessionError;
use super::handle::Handle;
use std::sync::Arc;

/// Which dataset, by its position in the registry's datasets (the default
/// dataset is 0).
pub type DatasetIndex = usize;

/// The default dataset's position.
pub const DEFAULT: DatasetIndex = 0;

/// An authenticated caller and its session in each dataset.
#[derive(Clone)]
pub struct Caller {
    pub(super) principal: Arc<str>,
    /// What the caller presented, so that a long-lived caller (a stream)
    /// can be checked again against the registry as it is now
    /// ([`Sessions::recheck`](super::Sessions::recheck)): a rotated key
    /// stops working there too.
    pub(super) presented: Presented,
    /// One per dataset, in the registry's order.
    pub(super) handles: Arc<[Handle]>,
}

impl Caller {
    /// The principal's name.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The handle on this caller's session in `dataset`.
    ///
    /// # Errors
    /// [`SessionError::Poisoned`] for a dataset the registry does not
    /// have (the models and the registry are built from one
    /// configuration, so this is a bug, never the client's doing).
    pub fn on(&self, dataset: DatasetIndex) -> Result<&Handle, SessionError> {
        self.handles.get(dataset).ok_or(SessionError::Poisoned)
    }
}
