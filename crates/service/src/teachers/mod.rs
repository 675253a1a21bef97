//! Teacher fan-out: every query goes to all m teachers over the Open
//! Inference Protocol (`ModelInfer`) — one model per teacher, or one
//! stacked model answering for all m — usually batched with concurrent
//! queries ([`Batching`]), and comes back as the m outputs in subset order
//! ([`pacpriv_privacy::mechanism::TeacherOutputs`]) or as an error.
//!
//! - [`fanout`]: the ensemble — asks every model, splits replies per query;
//! - [`batcher`]: dynamic batching in front of it;
//! - [`call`]: one model, one batched call with deadline and retries;
//! - [`connection`]: TLS and request headers towards an endpoint;
//! - [`demo`]: serves the demo teachers (`pacpriv_demo`) over the protocol.
//!
//! # Invariants
//! - All m teachers are asked, every time: traffic and latency never depend
//!   on which teacher is the secret one (this module never learns it).
//! - No partial answers: if any teacher has not answered after its retries,
//!   every query of that batch fails and nothing downstream is charged.
//! - Channels are persistent HTTP/2 connections, one per distinct endpoint
//!   (and TLS settings), shared by that endpoint's models; they reconnect
//!   on their own.

pub mod batcher;
pub mod call;
pub mod connection;
#[cfg(feature = "demo")]
pub mod demo;
mod error;
pub mod fanout;

pub use batcher::Batching;
pub use call::CallPolicy;
pub use error::FanoutError;
pub use fanout::{Ensemble, OutputMode, TeacherSpec, Teachers};

#[cfg(all(test, feature = "demo"))]
mod test;
