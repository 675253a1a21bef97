use super::*;

fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::load_with_env(None, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn shipped_default_is_valid_and_serves_the_demo() -> Result<(), SettingsError> {
    let s = load(&[])?;
    assert!(matches!(s.teachers, TeacherSource::Demo { models: 128, .. }));
    assert_eq!(s.per_query.get(), 2f64.powi(-24));
    assert_eq!(s.input_shape, [64]);
    assert_eq!(s.principals.len(), 1);
    assert_eq!(s.principals[0].name, "demo");
    Ok(())
}

#[test]
fn environment_overrides_scalars_and_adds_principals() -> Result<(), SettingsError> {
    let s = load(&[
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8"),
        ("PACPRIV__TEACHERS__DEADLINE_MS", "50"),
        ("PACPRIV__PRINCIPALS__TINY__KEY_SHA256", &"ab".repeat(32)),
        ("PACPRIV__PRINCIPALS__TINY__BUDGET_MI", "0.01"),
    ])?;
    assert_eq!(s.per_query.get(), 2f64.powi(-8));
    assert_eq!(s.call.deadline, Duration::from_millis(50));
    let tiny = s.principals.iter().find(|p| p.name == "tiny").map(|p| p.budget.get());
    assert_eq!(tiny, Some(0.01));
    Ok(())
}

#[test]
fn errors_name_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "lots", "privacy.per_query_mi"),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "1e-40", "privacy.per_query_mi"),
        ("PACPRIV__PRIVACY__SCOPE", "team", "privacy.scope"),
        ("PACPRIV__MODEL__MODE", "logits", "model.mode"),
        ("PACPRIV__SERVER__LISTEN", "localhost", "server.listen"),
        ("PACPRIV__DEMO__MODELS", "7", "demo.models"),
        ("PACPRIV__PRINCIPALS__DEMO__KEY_SHA256", "demo-key", "principals.demo.key_sha256"),
        ("PACPRIV__TEACHERS__SOURCE", "remote", "teachers.remote"),
    ];
    for (var, value, key) in cases {
        match load(&[(var, value)]) {
            Err(e) => assert!(e.to_string().contains(key), "{var}={value}: {e}"),
            Ok(_) => panic!("{var}={value} was accepted"),
        }
    }
}

#[test]
fn a_typo_is_an_error_not_a_silent_default() {
    let e = load(&[("PACPRIV__PRIVACY__PER_QUERY", "2^-8")]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("per_query"), "{e}");
}
