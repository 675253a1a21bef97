//! The README's example, run as written: `one_answer` below holds the
//! README's code block line for line (checked by `readme_shows_this_code`),
//! so neither can change without the other.

use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{self, SecretIndex, SessionState, TeacherOutputs};
use pacpriv_privacy::posterior::Posterior;

#[test]
fn one_answer() -> Result<(), pacpriv_privacy::PrivacyError> {
    let m = 8;
    let mut session = SessionState {
        posterior: Posterior::uniform(m)?,
        ledger: Ledger::new(Nats::new(1.0 / 16.0)?, Nats::new(1.0)?, Policy::Contested)?,
    };
    let outputs = TeacherOutputs::Labels { labels: vec![2, 2, 1, 2, 2, 1, 2, 2], classes: 4 };
    // Which subset the real data is: chosen once, uniformly, and kept secret.
    let secret = SecretIndex::new(3, m)?;

    let answer = mechanism::answer(&mut session, &outputs, secret, None, &mut rand::rng())?;

    assert!(answer.label < 4);
    assert!(answer.mi_bound <= 1.0 / 16.0); // the certificate: ½·tr(Σ⁺C) ≤ b
    assert_eq!(answer.charge.get(), 1.0 / 16.0); // contested: charged b
    assert_eq!(session.ledger.spent().get(), 1.0 / 16.0);
    Ok(())
}

#[test]
fn readme_shows_this_code() {
    let readme = include_str!("../README.md");
    let block: Vec<&str> = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md has a ```rust block")
        .lines()
        .map(str::trim)
        .collect();
    let here: Vec<&str> = include_str!("readme.rs").lines().map(str::trim).collect();
    // The imports head this file; the statements are `one_answer`'s body.
    let (imports, body): (Vec<&str>, Vec<&str>) = block.iter().partition(|l| l.starts_with("use "));
    let body = body.strip_prefix(&[""][..]).unwrap_or(&body);
    assert!(imports.iter().all(|l| here.contains(l)), "README.md's imports are not this file's");
    assert!(
        here.windows(body.len()).any(|w| w == body),
        "README.md's example is not the body of `one_answer` line for line"
    );
}
