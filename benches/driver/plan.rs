//! What `pacpriv-bench service` runs and compares: its knobs, the targets
//! (the privatizer and the plain proxy, in each fan-out layout), the
//! ratios it reports, and what one target's run measured. Shared by the
//! runner ([`super::service`]) and the report ([`super::report`]).

use super::load::Run;
use pacpriv_privacy::ledger::Policy;
use pacpriv_service::proto::pacpriv::Budget;
use pacpriv_service::session::Scope;
use std::time::Duration;

/// The knobs of one run, with the smoke or full defaults filled in.
#[derive(Clone, Debug)]
pub(super) struct Knobs {
    pub(super) models: usize,
    pub(super) seed: u64,
    pub(super) principals: usize,
    pub(super) warmup: Duration,
    pub(super) measure: Duration,
    pub(super) queries: Option<u64>,
}

/// Which server a target starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// The plain fan-out proxy ([`proxy`](crate::proxy)).
    Proxy,
    /// The real service ([`start::serve`](pacpriv_service::start::serve)).
    Privatizer,
}

/// One row of the report: a server and the configuration overrides it
/// (and, for the proxy, its fan-out) is built with.
pub(super) struct Target {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    /// `PACPRIV__…` overrides on top of the built-in defaults.
    pub(super) env: &'static [(&'static str, &'static str)],
}

const UNBATCHED: &[(&str, &str)] = &[("PACPRIV__TEACHERS__BATCH_WINDOW_MS", "0")];
const STACKED: &[(&str, &str)] = &[("PACPRIV__TEACHERS__LAYOUT", "stacked")];

/// The targets, in the order they run: each server at the default dynamic
/// batching, unbatched, and batched against the stacked model.
pub(super) const TARGETS: &[Target] = &[
    Target { name: "proxy", kind: Kind::Proxy, env: &[] },
    Target { name: "privatizer", kind: Kind::Privatizer, env: &[] },
    Target { name: "proxy-unbatched", kind: Kind::Proxy, env: UNBATCHED },
    Target { name: "privatizer-unbatched", kind: Kind::Privatizer, env: UNBATCHED },
    Target { name: "proxy-stacked", kind: Kind::Proxy, env: STACKED },
    Target { name: "privatizer-stacked", kind: Kind::Privatizer, env: STACKED },
];

/// A throughput ratio between two targets of the same run.
pub(super) struct Ratio {
    /// What it compares.
    pub(super) what: &'static str,
    pub(super) numerator: &'static str,
    pub(super) denominator: &'static str,
    /// The goal, as a minimum ratio.
    pub(super) goal: Option<f64>,
}

/// The ratios reported (those whose targets both ran): the two
/// goals first, then the same comparisons in the other configurations.
pub(super) const RATIOS: &[Ratio] = &[
    Ratio {
        what: "privatizer vs proxy, default batching",
        numerator: "privatizer",
        denominator: "proxy",
        goal: Some(0.9),
    },
    Ratio {
        what: "privatizer batched vs unbatched",
        numerator: "privatizer",
        denominator: "privatizer-unbatched",
        goal: Some(10.0),
    },
    Ratio {
        what: "privatizer vs proxy, unbatched",
        numerator: "privatizer-unbatched",
        denominator: "proxy-unbatched",
        goal: None,
    },
    Ratio {
        what: "privatizer vs proxy, stacked",
        numerator: "privatizer-stacked",
        denominator: "proxy-stacked",
        goal: None,
    },
    Ratio { what: "proxy batched vs unbatched", numerator: "proxy", denominator: "proxy-unbatched", goal: None },
    Ratio {
        what: "privatizer stacked vs per-teacher",
        numerator: "privatizer-stacked",
        denominator: "privatizer",
        goal: None,
    },
];

/// A target's run and what its checks need to know.
pub(super) struct Measured {
    pub(super) run: Run,
    /// Each client's principal's `GetBudget` after the run (privatizer
    /// targets; empty for the proxy).
    pub(super) budgets: Vec<Budget>,
    pub(super) classes: usize,
    pub(super) policy: Policy,
    pub(super) per_query: f64,
    pub(super) scope: Scope,
    /// The fan-out it ran with, for the report.
    pub(super) fanout: String,
}
