//! Integration tests: one binary, one module per area, shared helpers in
//! `util`. These run the real `pacpriv` binary.

mod accuracy;
mod audit;
mod bench_store;
mod budget;
mod crash;
mod label;
mod ops;
mod replicas;
mod service;
mod store;
mod subsets;
mod util;
mod utility;
