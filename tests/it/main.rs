//! Integration tests: one binary, one module per area, shared helpers in
//! `util`. These run the real `pacpriv` binary.

mod budget;
mod subsets;
mod util;
