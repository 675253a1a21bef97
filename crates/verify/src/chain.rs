//! The chain: each item's hash over the one before it, the versions and
//! event numbers without gaps, and each event justified by what came
//! before it (a cache hit by the answer it repeats, a refusal by the
//! replayed ledger or the teachers).

use super::Replaying;
use super::format::{self, EventLine};
use super::replay::outputs;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::{Nats, PrivacyError};
use pacpriv_records::EventKind;

impl Replaying {
    /// Checks event `e` (the next item of this session is an event). An
    /// altered hash is reported and the chain goes on from the recorded
    /// one, so that what follows is still checked.
    pub(super) fn event(&mut self, e: &EventLine) -> Result<(), String> {
        if self.broken {
            return Ok(());
        }
        if e.event != self.events + 1 {
            self.broken = true;
            return Err(format!(
                "expected event {} next: an event is missing or out of order (the rest of this session is not \
                 checked)",
                self.events + 1
            ));
        }
        let event = e.event().ok_or("a hash or digest is not hex")?;
        let altered = self.follow(&event.chain, event.chained(&self.head));
        self.events = e.event;
        let kind = EventKind::parse(&e.kind).ok_or_else(|| format!("{:?} is not a kind of event", e.kind))?;
        if kind == EventKind::CacheHit {
            self.cache_hits += 1;
        } else {
            self.refusals += 1;
        }
        let justified = if e.after_version != self.version {
            Err(format!("it says it came after version {}, but follows version {}", e.after_version, self.version))
        } else {
            self.justify(e, kind)
        };
        with_altered(altered, justified)
    }

    /// Moves the chain on from an item whose recorded hash is `recorded`
    /// and whose hash over the chain so far is `computed`: from the
    /// recorded one when they differ, so that what follows is still
    /// checked. Whether they differ.
    pub(super) fn follow(&mut self, recorded: &[u8], computed: [u8; 32]) -> bool {
        let altered = recorded != computed;
        self.head = if altered { recorded.try_into().unwrap_or(computed) } else { computed };
        altered
    }

    /// Checks that event `e` of `kind` follows from what came before it.
    fn justify(&self, e: &EventLine, kind: EventKind) -> Result<(), String> {
        let (spent, answered, charged) = self
            .state
            .as_ref()
            .map_or((Nats::ZERO, 0, 0), |s| (s.ledger.spent(), s.ledger.answered(), s.ledger.charged()));
        if spent.get().to_bits() != e.spent.to_bits() {
            return Err(format!("it records {:e} nats spent; the journal adds up to {:e}", e.spent, spent.get()));
        }
        let s = &e.step;
        let earlier = || {
            let digest = format::unhex(&s.digest).unwrap_or_default();
            self.answered
                .get(&digest)
                .filter(|_| !digest.is_empty())
                .ok_or("it names a query no earlier step of the session answered".to_owned())
        };
        match kind {
            EventKind::CacheHit => {
                let (label, published) = earlier()?;
                let same = s.published.is_empty()
                    || (s.published.len() == published.len()
                        && s.published.iter().zip(published).all(|(a, b)| a.to_bits() == b.to_bits()));
                if s.label != *label || !same {
                    return Err("a cache hit that released something other than what the step that answered its \
                                query released"
                        .into());
                }
            }
            EventKind::EvictedRepeat | EventKind::NoisyNotKept => {
                earlier()?;
            }
            EventKind::Exhausted => {
                let nats = |x: f64| Nats::new(x).map_err(|e| e.to_string());
                let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
                let ledger = Ledger::restore(nats(s.per_query)?, nats(s.limit)?, policy, spent, answered, charged)
                    .map_err(|e| e.to_string())?;
                // The service checks n charges of b as the rows' records
                // add them (`Ledger::check_charges`, n = need/b); journals
                // written before issue 53 checked need as one sum. Either
                // refusing is a refusal that held.
                // A request has at most 4096 rows (server.max_batch_rows);
                // a journal claiming more is judged by the single sum.
                let rows = (e.need / s.per_query).round();
                let refused_by_records = (1.0..=4096.0).contains(&rows) && ledger.check_charges(rows as u64).is_err();
                if e.need <= 0.0 || (ledger.check(nats(e.need)?).is_ok() && !refused_by_records) {
                    return Err(format!(
                        "a budget refusal, although {:e} nats more fit the limit {:e} after {:e} spent",
                        e.need, s.limit, e.spent
                    ));
                }
            }
            EventKind::Contested => {
                let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
                if policy != Policy::UnanimousOnly || outputs(s)?.unanimous() {
                    return Err("a contested refusal of a query that policy answers (unanimous teachers, or a \
                                policy other than unanimous_only)"
                        .into());
                }
            }
        }
        Ok(())
    }
}

/// An item's finding: `checked`'s, after [`ALTERED`] when its hash did
/// not match.
pub(super) fn with_altered(altered: bool, checked: Result<(), String>) -> Result<(), String> {
    match (altered, checked) {
        (true, Ok(())) => Err(ALTERED.into()),
        (true, Err(what)) => Err(format!("{ALTERED}; and {what}")),
        (false, checked) => checked,
    }
}

/// What a chain hash that does not match means.
const ALTERED: &str = "its chain hash does not match: this record, or one before it, was altered, inserted or removed";
