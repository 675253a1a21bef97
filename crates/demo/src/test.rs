use super::*;

#[test]
fn dataset_is_the_full_optical_digits_test_set() -> Result<(), String> {
    let all = digits::load()?;
    assert_eq!(all.len(), 1797);
    assert!(all.iter().all(|e| e.pixels.iter().all(|&p| (0.0..=16.0).contains(&p))));
    for d in 0..CLASSES {
        assert!(all.iter().filter(|e| e.digit == d).count() > 170, "digit {d} under-represented");
    }
    let s = digits::split(7)?;
    assert_eq!((s.train.len(), s.test.len()), (1438, 359));
    Ok(())
}

#[test]
fn training_is_deterministic_and_teachers_are_accurate_but_not_identical() -> Result<(), String> {
    let a = Trained::train(4, 11)?;
    let b = Trained::train(4, 11)?;
    let test = &a.split.test;
    let mut disagreements = 0;
    for (i, (ta, tb)) in a.teachers.iter().zip(&b.teachers).enumerate() {
        let mut correct = 0;
        for e in test {
            let x: Vec<f64> = e.pixels.iter().map(|&p| f64::from(p)).collect();
            assert_eq!(ta.predict_proba(&x), tb.predict_proba(&x), "teacher {i} differs between runs");
            correct += usize::from(ta.predict(&x) == e.digit);
            disagreements += usize::from(ta.predict(&x) != a.teachers[0].predict(&x));
        }
        let acc = correct as f64 / test.len() as f64;
        assert!(acc > 0.85, "teacher {i} accuracy {acc}");
    }
    // Different halves of the data give different models somewhere.
    assert!(disagreements > 0);
    Ok(())
}

#[test]
fn each_teacher_trains_on_exactly_its_subset() -> Result<(), String> {
    let e = Trained::train(2, 3)?;
    let n = e.split.train.len();
    let a = e.assignment.members_of_subset(0);
    let b = e.assignment.members_of_subset(1);
    // m = 2: every point is in exactly one of the two halves.
    assert_eq!(a.len() + b.len(), n);
    assert!(a.iter().all(|i| !b.contains(i)));
    Ok(())
}

/// Planted canaries are what a membership audit needs: the teachers that
/// trained on one answer it with its label far more often than the rest.
#[test]
fn teachers_that_trained_on_a_canary_answer_it_with_its_label() -> Result<(), String> {
    let (m, k) = (16, 20);
    let e = Trained::train_with_canaries(m, 5, DEFAULT_REGULARISATION, k)?;
    let n = e.split.train.len();
    let canaries = &e.split.train[n - k..];
    assert_eq!(canaries, digits::canaries(k, 5).as_slice());
    let (mut member, mut outsider) = ((0, 0), (0, 0));
    for (c, canary) in canaries.iter().enumerate() {
        let pixels: Vec<f64> = canary.pixels.iter().map(|&p| f64::from(p)).collect();
        for (i, t) in e.teachers.iter().enumerate() {
            let hit = usize::from(t.predict(&pixels) == canary.digit);
            if e.assignment.contains(i, n - k + c) {
                member = (member.0 + hit, member.1 + 1);
            } else {
                outsider = (outsider.0 + hit, outsider.1 + 1);
            }
        }
    }
    let (pm, po) = (member.0 as f64 / member.1 as f64, outsider.0 as f64 / outsider.1 as f64);
    eprintln!("members answer a canary's label {pm:.3} of the time, others {po:.3}");
    assert_eq!(member.1, k * m / 2, "each canary in exactly half the subsets");
    assert!(pm > 0.9 && po < 0.3, "members {pm}, others {po}");
    Ok(())
}

/// The second learner: naive Bayes teachers train on the same subsets in
/// a fraction of the logistic fit's time, answer well above chance, and
/// their class probabilities are a distribution even far from every
/// class (where the likelihoods themselves underflow).
#[test]
fn naive_bayes_teachers_are_fast_accurate_enough_and_well_formed() -> Result<(), String> {
    let e = Trained::train_learner(4, 11, Learner::NaiveBayes, 0)?;
    let logistic = Trained::train(4, 11)?;
    assert_eq!(e.assignment.members_of_subset(2), logistic.assignment.members_of_subset(2), "the same subsets");
    let test = &e.split.test;
    for (i, t) in e.teachers.iter().enumerate() {
        let correct = test
            .iter()
            .filter(|x| t.predict(&x.pixels.iter().map(|&p| f64::from(p)).collect::<Vec<_>>()) == x.digit)
            .count();
        let acc = correct as f64 / test.len() as f64;
        assert!(acc > 0.7, "teacher {i} accuracy {acc}");
    }
    for pixels in [
        vec![16.0; FEATURES],
        vec![0.0; FEATURES],
        (0..FEATURES).map(|j| (j % 17) as f64).collect(),
        vec![1e300; FEATURES],
        vec![-1e300; FEATURES],
    ] {
        let p = e.teachers[0].predict_proba(&pixels)[0];
        assert!(p.iter().all(|v| v.is_finite() && *v >= 0.0), "{p:?}");
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{p:?}");
    }
    Ok(())
}
