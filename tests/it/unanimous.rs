//! Issue 25 §3: `privacy.policy = "unanimous_only"` over real gRPC, on
//! held-out demo digits: every query is either answered exactly by all 16
//! teachers agreeing (charged nothing) or refused FAILED_PRECONDITION with
//! reason CONTESTED, `charged = "false"`; the budget never moves.

use crate::util::{Process, budget, client, image, predict, small_demo};
use pacpriv::teachers::demo::digits;
use tonic_types::StatusExt;

/// The demo's seed (config/default.toml), hence its split.
const SEED: u64 = 20261123;

#[tokio::test(flavor = "multi_thread")]
async fn unanimous_only_answers_agreement_for_free_and_refuses_the_rest_uncharged() {
    let env = small_demo(&[("PACPRIV__PRIVACY__POLICY", "unanimous_only".to_owned())]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let held_out = digits::split(SEED).expect("the demo data splits").test;
    let (mut answered, mut correct, mut refused) = (0, 0, 0);
    for (i, example) in held_out.iter().take(150).enumerate() {
        match predict(&mut c, "alice-key", image(&format!("q{i}"), &example.pixels)).await {
            Ok(r) => {
                assert!(r.unanimous && r.mi_charged == 0.0, "q{i}: only unanimous, free answers: {r:?}");
                answered += 1;
                correct += usize::from(r.label as usize == example.digit);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition, "q{i}: {status:?}");
                let info = status.get_error_details().error_info().cloned().expect("ErrorInfo detail");
                assert_eq!(info.reason, "CONTESTED", "q{i}");
                assert_eq!(info.metadata.get("charged").map(String::as_str), Some("false"), "q{i}");
                assert!(status.message().contains("unanimous_only"), "actionable: {}", status.message());
                refused += 1;
            }
        }
    }
    assert!(answered > 0 && refused > 0, "held-out digits give both kinds: {answered} answered, {refused} refused");
    assert!(correct * 10 >= answered * 9, "unanimous answers are mostly right: {correct}/{answered}");
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.spent, account.answered as usize, account.charged), (0.0, answered, 0));
    assert_eq!(account.policy, "unanimous_only");
}
