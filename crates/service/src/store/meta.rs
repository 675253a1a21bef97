//! The deployment-wide record: the sealed secret index and the teacher
//! set it belongs to.

/// The deployment-wide record.
#[derive(Clone, PartialEq, Eq)]
pub struct Meta {
    /// s*, sealed: only [`crate::session`] turns it into a `SecretIndex`.
    pub secret: usize,
    /// Describes the teacher set s* indexes into (m and model names).
    pub teachers: String,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("secret", &"<redacted>").field("teachers", &self.teachers).finish()
    }
}
