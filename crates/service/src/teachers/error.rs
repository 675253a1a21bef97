//! Why a query could not be answered by all teachers.

/// Why a query could not be answered by all teachers.
#[derive(Clone, Debug, thiserror::Error)]
pub enum FanoutError {
    /// A teacher failed or was late on every attempt.
    #[error("teacher {model} at {endpoint} did not answer after {attempts} attempt(s): {reason}")]
    Unreachable {
        /// Its model name.
        model: String,
        /// Its endpoint.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// A teacher answered with something that is not a label or a score
    /// vector of the configured size.
    #[error("teacher {model} at {endpoint} returned an unusable output: {reason}")]
    BadOutput {
        /// Its model name.
        model: String,
        /// Its endpoint.
        endpoint: String,
        /// What was wrong.
        reason: String,
    },
    /// An endpoint in the configuration is not a valid URI.
    #[error("teacher endpoint {endpoint:?} is not a valid URI: {reason}")]
    Endpoint {
        /// The configured string.
        endpoint: String,
        /// Parser message.
        reason: String,
    },
    /// A teacher endpoint's TLS or header settings are unusable, or its
    /// certificate does not verify.
    #[error("teacher endpoint {endpoint}: {reason}")]
    Connection {
        /// The configured endpoint.
        endpoint: String,
        /// What is wrong, naming the setting.
        reason: String,
    },
    /// The fan-out is shutting down (or one of its tasks failed).
    #[error("the teacher fan-out has stopped; retry against a running server")]
    Stopped,
}
