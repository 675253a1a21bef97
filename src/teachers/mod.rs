//! Teacher fan-out: every query goes to all m teachers in parallel over the
//! Open Inference Protocol (`ModelInfer`), and comes back as the m outputs
//! in subset order ([`TeacherOutputs`]) or as an error.
//!
//! # Invariants
//! - All m teachers are asked, every time: traffic and latency never depend
//!   on which teacher is the secret one (this module never learns it).
//! - No partial answers: if any teacher has not answered after its retries,
//!   the whole query fails and nothing downstream is charged.
//! - Channels are persistent HTTP/2 connections, one per distinct endpoint,
//!   shared by that endpoint's models; they reconnect on their own.

pub mod demo;
mod fanout;

pub use fanout::{CallPolicy, Ensemble, FanoutError, OutputMode, TeacherSpec};
