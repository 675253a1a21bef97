use super::*;
use crate::teachers::connection::ClientTls;
use crate::teachers::{OutputMode, Teachers};
use pacpriv_store::{PgLink, PgTls, SslMode};

fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::load_with_env(None, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn shipped_default_is_valid_and_serves_the_demo() -> Result<(), SettingsError> {
    let s = load(&[])?;
    assert!(matches!(s.model.teachers, TeacherSource::Demo { models: 128, .. }));
    assert_eq!(s.dataset.per_query.get(), 2f64.powi(-24));
    assert_eq!(s.model.input_shape, [64]);
    assert_eq!(s.principals.len(), 1);
    assert_eq!(s.principals[0].name, "demo");
    assert!(matches!(s.model.teachers, TeacherSource::Demo { canaries: 0, .. }), "no canaries unless asked");
    Ok(())
}

/// No key, file or variable reaches the calibration: a loaded configuration
/// is always certified (only the canary audit's broken test server, which
/// is Rust code, sets anything else).
#[test]
fn a_loaded_configuration_is_always_certified() -> Result<(), SettingsError> {
    for (var, value) in [("PACPRIV__CALIBRATION", "under_noised"), ("PACPRIV__PRIVACY__CALIBRATION", "x")] {
        if let Ok(s) = load(&[(var, value)]) {
            assert_eq!(s.calibration, Calibration::Certified, "{var}");
        }
    }
    assert_eq!(load(&[])?.calibration, Calibration::Certified);
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
    assert_eq!(s.dataset.per_query.get(), 2f64.powi(-8));
    assert_eq!(s.model.call.deadline, Duration::from_millis(50));
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
        ("PACPRIV__DEMO__REGULARISATION", "0", "demo.regularisation"),
        ("PACPRIV__DEMO__REGULARISATION", "-1", "demo.regularisation"),
        ("PACPRIV__PRINCIPALS__DEMO__KEY_SHA256", "demo-key", "principals.demo.key_sha256"),
        ("PACPRIV__TEACHERS__SOURCE", "remote", "teachers.remote"),
        ("PACPRIV__TEACHERS__LAYOUT", "stack", "teachers.layout"),
        ("PACPRIV__SERVER__INFERENCE_MODEL", "models/private", "server.inference_model"),
        ("PACPRIV__TEACHERS__MAX_BATCH", "0", "teachers.max_batch"),
        ("PACPRIV__TEACHERS__MAX_BATCH", "1025", "teachers.max_batch"),
        ("PACPRIV__TEACHERS__BATCH_WINDOW_MS", "1001", "teachers.batch_window_ms"),
        ("PACPRIV__SERVER__MAX_CONCURRENT_STREAMS", "0", "server.max_concurrent_streams"),
        ("PACPRIV__SERVER__RATE_LIMIT_BURST", "10", "server.rate_limit_burst"),
    ];
    for (var, value, key) in cases {
        match load(&[(var, value)]) {
            Err(e) => assert!(e.to_string().contains(key), "{var}={value}: {e}"),
            Ok(_) => panic!("{var}={value} was accepted"),
        }
    }
}

/// Enumerated keys are parsed into enums: a value outside the choices is
/// refused by parsing, naming the key, the value and the choices.
#[test]
fn enumerated_keys_are_refused_by_parsing_with_the_choices() {
    let cases: &[(&str, &str, &str, &str)] = &[
        ("PACPRIV__PRIVACY__POLICY", "cheap", "privacy.policy", "`contested`"),
        ("PACPRIV__PRIVACY__SCOPE", "team", "privacy.scope", "`per_principal`"),
        ("PACPRIV__PRIVACY__ANSWER_CACHE_EVICTED", "forget", "privacy.answer_cache_evicted", "`refuse`"),
        ("PACPRIV__STORE__BACKEND", "sqlite", "store.backend", "`postgres`"),
        ("PACPRIV__SERVER__LOG_FORMAT", "xml", "server.log_format", "`json`"),
        ("PACPRIV__MODEL__MODE", "logits", "model.mode", "`vector`"),
        ("PACPRIV__TEACHERS__SOURCE", "cloud", "teachers.source", "`remote`"),
        ("PACPRIV__TEACHERS__LAYOUT", "stack", "teachers.layout", "`per_teacher`"),
        ("PACPRIV__TEACHERS__INPUT_DATATYPE", "INT8", "teachers.input_datatype", "`FP64`"),
    ];
    for (var, value, key, choice) in cases {
        let e = load(&[(var, value)]).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("{var}={value} accepted"));
        for part in [key, value, choice] {
            assert!(e.contains(part), "{var}={value}: the message names {part}: {e}");
        }
    }
}

#[test]
fn a_typo_is_an_error_not_a_silent_default() {
    let e = load(&[("PACPRIV__PRIVACY__PER_QUERY", "2^-8")]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("per_query"), "{e}");
}

#[test]
fn a_remote_stacked_ensemble_needs_an_endpoint_a_model_and_an_even_m() -> Result<(), SettingsError> {
    let stacked = [
        ("PACPRIV__TEACHERS__SOURCE", "remote"),
        ("PACPRIV__TEACHERS__LAYOUT", "stacked"),
        ("PACPRIV__TEACHERS__STACKED__ENDPOINT", "http://127.0.0.1:8001"),
        ("PACPRIV__TEACHERS__STACKED__MODEL", "ensemble"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| load(&[&stacked[..], extra].concat());
    let s = with(&[("PACPRIV__TEACHERS__STACKED__MODELS", "16")])?;
    assert!(matches!(s.model.teachers, TeacherSource::Remote(Teachers::Stacked { models: 16, .. })));
    let e = with(&[("PACPRIV__TEACHERS__STACKED__MODELS", "15")]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("teachers.stacked.models"), "{e}");
    let e = load(&stacked[..2]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("teachers.stacked"), "{e}");
    Ok(())
}

#[test]
fn a_zero_window_turns_batching_off() -> Result<(), SettingsError> {
    let s = load(&[("PACPRIV__TEACHERS__BATCH_WINDOW_MS", "0"), ("PACPRIV__TEACHERS__MAX_BATCH", "8")])?;
    assert_eq!(s.model.batching.window, Duration::ZERO);
    assert_eq!(s.model.batching.max_batch, 8);
    Ok(())
}

#[test]
fn the_inference_model_is_named_or_turned_off() -> Result<(), SettingsError> {
    assert_eq!(load(&[])?.inference_model.as_deref(), Some("private"));
    assert_eq!(load(&[("PACPRIV__SERVER__INFERENCE_MODEL", "digits")])?.inference_model.as_deref(), Some("digits"));
    assert_eq!(load(&[("PACPRIV__SERVER__INFERENCE_MODEL", "")])?.inference_model, None);
    Ok(())
}

#[test]
fn rate_limit_is_off_by_default_and_its_burst_defaults_to_the_rate() -> Result<(), SettingsError> {
    assert_eq!(load(&[])?.rate_limit, None);
    let q = load(&[("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "50")])?
        .rate_limit
        .map(|q| (q.per_second.get(), q.burst.get()));
    assert_eq!(q, Some((50, 50)));
    let q = load(&[("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "50"), ("PACPRIV__SERVER__RATE_LIMIT_BURST", "200")])?
        .rate_limit
        .map(|q| (q.per_second.get(), q.burst.get()));
    assert_eq!(q, Some((50, 200)));
    Ok(())
}

/// docs/operations/configuration.md lists every key of the shipped configuration,
/// each with its environment variable (scalars) and its default.
#[test]
fn the_configuration_reference_lists_every_key() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time: docs/ is no input of the build (the image's
    // builder does not copy it).
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations/configuration.md"))?;
    let shipped = Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml)).build()?;
    let table: BTreeMap<String, config::Value> = shipped.try_deserialize()?;
    for (section, keys) in table.into_iter().filter(|(s, _)| s != "principals") {
        for (key, value) in keys.into_table()? {
            let row = reference
                .lines()
                .find(|l| l.starts_with(&format!("| `{section}.{key}` |")))
                .ok_or_else(|| format!("docs/operations/configuration.md has no row for {section}.{key}"))?;
            let scalar = !matches!(value.kind, config::ValueKind::Table(_) | config::ValueKind::Array(_));
            let env = format!("`PACPRIV__{}__{}`", section.to_uppercase(), key.to_uppercase());
            assert!(!scalar || row.contains(&env), "{section}.{key}: the row does not name {env}");
            let default = value.to_string();
            assert!(!scalar || row.contains(&default), "{section}.{key}: the row does not give the default {default}");
        }
    }
    Ok(())
}

/// A replica waits at most `store.postgres_timeout_ms` on its database,
/// and never less than a second.
#[test]
fn the_postgres_timeout_is_read_and_bounded_below() -> Result<(), SettingsError> {
    let pg =
        [("PACPRIV__STORE__BACKEND", "postgres"), ("PACPRIV__STORE__POSTGRES_URL", "postgres://pacpriv@db/pacpriv")];
    let timeout = |s: Settings| match s.store {
        StoreSettings::Postgres { link, .. } => Some(link.timeout),
        StoreSettings::Embedded { .. } => None,
    };
    assert_eq!(timeout(load(&pg)?), Some(PgLink::DEFAULT_TIMEOUT));
    let two_seconds = [pg[0], pg[1], ("PACPRIV__STORE__POSTGRES_TIMEOUT_MS", "2000")];
    assert_eq!(timeout(load(&two_seconds)?), Some(Duration::from_secs(2)));
    let Err(e) = load(&[pg[0], pg[1], ("PACPRIV__STORE__POSTGRES_TIMEOUT_MS", "999")]) else {
        panic!("a timeout under a second was accepted")
    };
    assert!(e.to_string().contains("store.postgres_timeout_ms"), "{e}");
    Ok(())
}

/// Issue 53 §7: how long a start waits for a node that accepts writes is
/// read (two minutes unless set; 0 does not wait) and bounded by a day.
#[test]
fn the_start_wait_is_read_and_bounded() -> Result<(), SettingsError> {
    let pg =
        [("PACPRIV__STORE__BACKEND", "postgres"), ("PACPRIV__STORE__POSTGRES_URL", "postgres://pacpriv@db/pacpriv")];
    let wait = |s: Settings| match s.store {
        StoreSettings::Postgres { start_wait, .. } => Some(start_wait),
        StoreSettings::Embedded { .. } => None,
    };
    assert_eq!(wait(load(&pg)?), Some(Duration::from_secs(120)));
    assert_eq!(wait(load(&[pg[0], pg[1], ("PACPRIV__STORE__START_WAIT_MS", "0")])?), Some(Duration::ZERO));
    let Err(e) = load(&[pg[0], pg[1], ("PACPRIV__STORE__START_WAIT_MS", "86400001")]) else {
        panic!("a start wait over a day was accepted")
    };
    assert!(e.to_string().contains("store.start_wait_ms"), "{e}");
    Ok(())
}

/// Issue 40 §6: an `sslmode` in the URL is never overridden by the
/// setting's default: a URL that asks for TLS the setting does not give is
/// refused, naming both keys; one the setting meets or exceeds is taken
/// without its `sslmode` (the setting decides the connection).
#[test]
fn a_url_sslmode_the_setting_does_not_meet_is_refused() {
    let with = |url: &str, mode: &str| {
        load(&[
            ("PACPRIV__STORE__BACKEND", "postgres"),
            ("PACPRIV__STORE__POSTGRES_URL", url),
            ("PACPRIV__STORE__POSTGRES_SSLMODE", mode),
            ("PACPRIV__STORE__POSTGRES_SSLROOTCERT", "Cargo.toml"),
        ])
    };
    for (url, mode) in [
        ("postgres://pacpriv@db/pacpriv?sslmode=require", "disable"),
        ("postgresql://pacpriv@db/pacpriv?connect_timeout=3&sslmode=verify-full", "require"),
        ("host=db user=pacpriv sslmode=verify-ca", "require"),
        ("postgres://pacpriv@db/pacpriv?sslmode=prefer", "require"),
        ("host=db sslmode=allow", "verify-full"),
        ("postgres://pacpriv@db/pacpriv?ssl%6Dode=require", "disable"),
        ("host=db sslmode = require", "disable"),
    ] {
        let e = with(url, mode).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("store.postgres_url") && e.contains("store.postgres_sslmode"), "{url} / {mode}: {e:?}");
    }
    for (url, mode) in [
        ("postgres://pacpriv@db/pacpriv?sslmode=require", "require"),
        ("postgres://pacpriv@db/pacpriv?sslmode=require", "verify-full"),
        ("postgres://pacpriv@db/pacpriv?sslmode=disable", "disable"),
        ("host=db sslmode=verify-full user=pacpriv", "verify-full"),
    ] {
        assert!(with(url, mode).is_ok(), "{url} / {mode}");
    }
    let tls = PgTls { mode: SslMode::VerifyFull, root_cert: None };
    for (url, without) in [
        ("postgres://u@db/x?sslmode=verify-full", "postgres://u@db/x"),
        ("postgres://u@db/x?a=1&sslmode=require&b=2", "postgres://u@db/x?a=1&b=2"),
        ("host=db sslmode=require user=u", "host=db user=u"),
        ("postgres://u@db/x", "postgres://u@db/x"),
    ] {
        assert_eq!(tls.url_for(url).as_deref(), Ok(without), "{url}");
    }
}

/// Issue 40 §7: `Debug` of the settings shows no password of the store's
/// URL and no teacher's client key.
#[test]
fn debug_hides_passwords_and_keys() {
    for (url, secret) in [
        ("postgres://pacpriv:hunter2@db:5432/pacpriv?sslmode=disable", "hunter2"),
        ("postgresql://u:hunter2@db/x?password=hunter3", "hunter"),
        ("host=db user=u password=hunter2 dbname=x", "hunter2"),
        ("host=db user=u password = 'hunter 2'", "hunter"),
        ("postgres://u:hunter/2@db/x", "hunter"),
        ("postgres://u:p@db?password=hunter2", "hunter2"),
        ("postgres://u@db/x?pass%77ord=hunter2", "hunter2"),
    ] {
        let store = StoreSettings::Postgres { url: url.into(), link: PgLink::plain(1), start_wait: Duration::ZERO };
        let shown = format!("{store:?}");
        assert!(!shown.contains(secret) && shown.contains("***"), "{shown}");
        assert!(shown.contains("db"), "the rest stays readable: {shown}");
    }
    let tls = ClientTls {
        ca_file: "ca.pem".into(),
        ca_pem: b"CA".to_vec(),
        identity: Some((b"CERT".to_vec(), b"PRIVATE-KEY-BYTES".to_vec())),
        server_name: None,
    };
    let shown = format!("{tls:?}");
    assert!(!shown.contains("PRIVATE") && !shown.contains("80, 82, 73"), "{shown}");
}

/// Issue 54 §1: every configuration that worked before is one model,
/// named as the Open Inference Protocol named it.
#[test]
fn the_shipped_configuration_is_one_dataset_the_model_private_and_its_demo_twin() -> Result<(), SettingsError> {
    let s = load(&[])?;
    assert_eq!(s.model.name, "private");
    assert_eq!(s.datasets().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["default"]);
    // The demo's second model: naive Bayes teachers on the same subsets,
    // over the same dataset.
    let bayes = s.more_models.iter().map(|m| (m.name.as_str(), m.dataset.as_str(), &m.teachers)).collect::<Vec<_>>();
    assert!(
        matches!(
            bayes.as_slice(),
            [(
                "bayes",
                "default",
                TeacherSource::Demo { models: 128, seed: 20261123, learner: DemoLearner::NaiveBayes, .. }
            )]
        ),
        "{bayes:?}"
    );
    assert!(load(&[("PACPRIV__DEMO__NAIVE_BAYES_MODEL", "")])?.more_models.is_empty());
    // Remote teachers: one model, as every earlier configuration was.
    let remote = load(&[
        ("PACPRIV__TEACHERS__SOURCE", "remote"),
        ("PACPRIV__TEACHERS__LAYOUT", "stacked"),
        ("PACPRIV__TEACHERS__STACKED__ENDPOINT", "http://127.0.0.1:8001"),
        ("PACPRIV__TEACHERS__STACKED__MODEL", "ensemble"),
        ("PACPRIV__TEACHERS__STACKED__MODELS", "4"),
    ])?;
    assert!(remote.more_models.is_empty() && remote.more_datasets.is_empty());
    assert_eq!(load(&[("PACPRIV__SERVER__INFERENCE_MODEL", "")])?.model.name, DEFAULT_MODEL);
    assert_eq!(load(&[("PACPRIV__SERVER__INFERENCE_MODEL", "digits")])?.model.name, "digits");
    Ok(())
}

#[test]
fn a_model_says_only_how_it_differs_from_the_default() -> Result<(), SettingsError> {
    let s = load(&[
        ("PACPRIV__DEMO__MODELS", "16"),
        ("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "1.5"),
        ("PACPRIV__MODELS__RIDGE__TEACHERS__DEADLINE_MS", "50"),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", ""),
    ])?;
    assert_eq!(s.more_models.len(), 1);
    let ridge = &s.more_models[0];
    assert_eq!(ridge.name, "ridge");
    assert!(matches!(
        ridge.teachers,
        TeacherSource::Demo { models: 16, seed: 20261123, regularisation: 1.5, canaries: 0, .. }
    ));
    assert!(matches!(s.model.teachers, TeacherSource::Demo { regularisation: 0.01, .. }), "the default's own");
    assert_eq!((ridge.call.deadline, s.model.call.deadline), (Duration::from_millis(50), Duration::from_secs(2)));
    assert_eq!((ridge.mode, &ridge.input_shape), (s.model.mode, &s.model.input_shape));
    Ok(())
}

#[test]
fn a_model_of_remote_teachers_from_a_file() -> Result<(), SettingsError> {
    let dir = tempfile::tempdir().map_err(|e| err("test", e.to_string()))?;
    let remote = |prefix: &str| -> String {
        let entries: Vec<String> =
            (0..4).map(|i| format!("{{ endpoint = \"http://127.0.0.1:8001\", model = \"{prefix}-{i}\" }}")).collect();
        format!("[{}]", entries.join(", "))
    };
    let load_file = |models: &str| {
        let file = dir.path().join("models.toml");
        let toml = format!("[teachers]\nsource = \"remote\"\nremote = {}\n\n{models}", remote("digits"));
        std::fs::write(&file, toml).map_err(|e| err("test", e.to_string()))?;
        Settings::load_with_env(Some(&file), std::iter::empty())
    };
    let forest = format!(
        "[models.forest]\nmodel = {{ mode = \"vector\" }}\nteachers = {{ max_batch = 8, remote = {} }}\n",
        remote("forest")
    );
    let s = load_file(&forest)?;
    let forest = &s.more_models[0];
    assert!(matches!(&forest.teachers, TeacherSource::Remote(Teachers::PerTeacher(specs)) if specs.len() == 4));
    assert_eq!((forest.mode, forest.batching.max_batch), (OutputMode::Vector { dim: 10 }, 8));
    assert_eq!(s.model.mode, OutputMode::Label { classes: 10 });
    for (models, key) in [
        ("[models.same]\nmodel = { mode = \"vector\" }\n", "models.same.teachers"),
        ("[models.demo]\nteachers = { source = \"demo\" }\ndemo = { models = 4 }\n", "models.demo.teachers.source"),
        (
            &format!("[models.x]\ndemo = {{ regularisation = 2.0 }}\nteachers = {{ remote = {} }}\n", remote("x")),
            "models.x.demo",
        ),
        ("[models.Forest]\nmodel = { mode = \"vector\" }\n", "models.Forest"),
    ] {
        match load_file(models) {
            Ok(_) => panic!("{models} was accepted"),
            Err(e) => assert_eq!(e.key, key, "{models}: {e}"),
        }
    }
    Ok(())
}

#[test]
fn a_model_over_other_data_or_a_bad_key_is_refused_naming_it() {
    let cases: &[(&str, &str, &str)] = &[
        ("PACPRIV__MODELS__RIDGE__DEMO__MODELS", "64", "models.ridge.demo.models"),
        ("PACPRIV__MODELS__RIDGE__DEMO__SEED", "1", "models.ridge.demo"),
        ("PACPRIV__MODELS__RIDGE__DEMO__CANARIES", "2", "models.ridge.demo"),
        ("PACPRIV__MODELS__PRIVATE__DEMO__REGULARISATION", "1", "models.private"),
        ("PACPRIV__MODELS__RIDGE__TEACHERS__SOURCE", "remote", "models.ridge.teachers.remote"),
        ("PACPRIV__MODELS__RIDGE__MODEL__CLASSES", "1", "models.ridge.model.classes"),
        ("PACPRIV__MODELS__RIDGE__TEACHERS__SOURSE", "remote", "models.ridge"),
        ("PACPRIV__MODELS__RIDGE__TEACHERS__HEALTH_INTERVAL_MS", "200", "models.ridge.teachers.health_interval_ms"),
        ("PACPRIV__MODELS__RIDGE__DEMO__LISTEN", "127.0.0.1:9000", "models.ridge.demo.listen"),
        ("PACPRIV__MODELS__RIDGE__TEACHERS__DEADLINE_MS", "50", "models.ridge.teachers"),
    ];
    for (var, value, key) in cases {
        let mut env = vec![(*var, *value)];
        if key.ends_with("demo.listen") {
            env.push(("PACPRIV__DEMO__LISTEN", "127.0.0.1:9000"));
        }

        match load(&env) {
            Ok(_) => panic!("{var}={value} was accepted"),
            Err(e) => assert!(e.key.starts_with(key), "{var}={value}: {e} should name {key}"),
        }
    }
}

/// A model's own stacked endpoint inherits none of the default's
/// connection: its headers (credentials), certificates and CA.
#[test]
fn a_models_table_replaces_the_defaults_whole() -> Result<(), SettingsError> {
    let dir = tempfile::tempdir().map_err(|e| err("test", e.to_string()))?;
    let file = dir.path().join("stacked.toml");
    let token = dir.path().join("token");
    std::fs::write(&token, "secret\n").map_err(|e| err("test", e.to_string()))?;
    let toml = format!(
        "[teachers]\nsource = \"remote\"\nlayout = \"stacked\"\nallow_plaintext_credentials = true\n\
         stacked = {{ endpoint = \"http://10.0.0.5:8001\", model = \"a\", version = \"\", models = 4, \
         headers = [{{ name = \"authorization\", prefix = \"Bearer \", value_file = {:?} }}] }}\n\n\
         [models.other]\nteachers = {{ stacked = {{ endpoint = \"http://10.0.0.6:8001\", model = \"b\", \
         version = \"\", models = 4 }} }}\n",
        token.display().to_string()
    );
    std::fs::write(&file, toml).map_err(|e| err("test", e.to_string()))?;
    let s = Settings::load_with_env(Some(&file), std::iter::empty())?;
    let headers = |t: &TeacherSource| match t {
        TeacherSource::Remote(Teachers::Stacked { spec, .. }) => (spec.model.clone(), spec.connection.headers.len()),
        _ => (String::new(), usize::MAX),
    };
    assert_eq!(headers(&s.model.teachers), ("a".to_owned(), 1));
    assert_eq!(headers(&s.more_models[0].teachers), ("b".to_owned(), 0), "the default's credentials stay its own");
    Ok(())
}

/// A second dataset: its own keys over `[privacy]`'s (but its own secret
/// index file), and a model over it with its own data.
#[test]
fn a_dataset_takes_privacy_keys_and_its_models_their_own_data() -> Result<(), SettingsError> {
    let fashion = [
        ("PACPRIV__PRIVACY__SECRET_INDEX_FILE", "/run/secrets/digits"),
        ("PACPRIV__DATASETS__FASHION__PER_QUERY_MI", "2^-10"),
        ("PACPRIV__DATASETS__FASHION__SCOPE", "global"),
        ("PACPRIV__MODELS__NB__DATASET", "fashion"),
        ("PACPRIV__MODELS__NB__DEMO__SEED", "7"),
        ("PACPRIV__MODELS__NB__DEMO__MODELS", "32"),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", ""),
    ];
    let s = load(&fashion)?;
    assert_eq!(s.datasets().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["default", "fashion"]);
    let other = &s.more_datasets[0];
    assert_eq!((other.per_query.get(), other.scope), (2f64.powi(-10), crate::session::Scope::Global));
    assert_eq!((other.policy, other.cache), (s.dataset.policy, s.dataset.cache), "the rest is [privacy]'s");
    assert_eq!(s.dataset.secret_index_file.as_deref(), Some(Path::new("/run/secrets/digits")));
    assert_eq!(other.secret_index_file, None, "s* is per dataset: never another dataset's file");
    let nb = &s.more_models[0];
    assert_eq!((nb.dataset.as_str(), nb.teachers.m(), s.dataset_of(nb)), ("fashion", 32, Some(1)));
    assert_eq!((s.model.dataset.as_str(), s.dataset_of(&s.model)), ("default", Some(0)));

    // Each refused, naming the key: (what is added to a dataset
    // `fashion` whose model `nb` is over its own demo subsets, the key).
    let nb_over_fashion = &fashion[2..];
    let refused: &[(&[(&str, &str)], &str)] = &[
        (&[("PACPRIV__MODELS__NB__DATASET", "fashoin")], "models.nb.dataset"),
        (&[("PACPRIV__DATASETS__DEFAULT__SCOPE", "global")], "datasets.default"),
        (&[("PACPRIV__DATASETS__FASHION__PER_QUERY_MI", "-1")], "datasets.fashion.per_query_mi"),
        (&[("PACPRIV__DATASETS__FASHION__PER_QUERY", "2^-10")], "datasets.fashion"),
        (&[("PACPRIV__DATASETS__EMPTY__SCOPE", "global")], "datasets.empty"),
        // The default model's subsets declared as a second dataset.
        (
            &[("PACPRIV__MODELS__NB__DEMO__SEED", "20261123"), ("PACPRIV__MODELS__NB__DEMO__MODELS", "128")],
            "models.nb.demo",
        ),
        // The same seed draws the same subsets, whatever the canaries.
        (
            &[("PACPRIV__MODELS__NB__DEMO__SEED", "20261123"), ("PACPRIV__MODELS__NB__DEMO__CANARIES", "3")],
            "models.nb.demo",
        ),
        // Two datasets, one secret file: one secret.
        (
            &[
                ("PACPRIV__PRIVACY__SECRET_INDEX_FILE", "/run/secrets/s"),
                ("PACPRIV__DATASETS__FASHION__SECRET_INDEX_FILE", "/run/secrets/s"),
            ],
            "datasets.fashion.secret_index_file",
        ),
        // A second model of `fashion` over other subsets, or another m.
        (&[("PACPRIV__MODELS__ZZ__DATASET", "fashion"), ("PACPRIV__MODELS__ZZ__DEMO__MODELS", "32")], "models.zz.demo"),
        (
            &[("PACPRIV__MODELS__ZZ__DATASET", "fashion"), ("PACPRIV__MODELS__ZZ__DEMO__SEED", "7")],
            "models.zz.demo.models",
        ),
    ];
    for (added, key) in refused {
        let env: Vec<(&str, &str)> = nb_over_fashion.iter().chain(added.iter()).copied().collect();
        match load(&env) {
            Ok(_) => panic!("{env:?} was accepted"),
            Err(e) => assert!(e.key.starts_with(key), "{env:?}: {e} should name {key}"),
        }
    }
    Ok(())
}

/// A configured principal's name is a store key and a metric label: it
/// can name neither the shared session nor another dataset's session.
#[test]
fn a_principal_name_that_could_collide_with_a_session_key_is_refused() {
    for name in ["fashion/alice", "*global*"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("p.toml");
        let toml = format!(
            "[datasets.fashion]\nscope = \"global\"\n\n[models.nb]\ndataset = \"fashion\"\ndemo = {{ seed = 7 }}\n\n\
             [principals.\"{name}\"]\nkey_sha256 = \"{}\"\nbudget_mi = \"1\"\n",
            "ab".repeat(32)
        );
        std::fs::write(&file, toml).expect("written");
        match Settings::load_with_env(Some(&file), std::iter::empty()) {
            Ok(_) => panic!("{name:?} was accepted"),
            Err(e) => assert_eq!(e.key, format!("principals.{name}"), "{e}"),
        }
    }
}

#[test]
fn a_version_is_the_model_retrained_on_the_same_subsets() -> Result<(), SettingsError> {
    let s = load(&[
        ("PACPRIV__DEMO__MODELS", "16"),
        ("PACPRIV__VERSIONS__PRIVATE__2__DEMO__REGULARISATION", "0.5"),
        ("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "1.5"),
        ("PACPRIV__VERSIONS__RIDGE__3__DEMO__REGULARISATION", "2.5"),
        ("PACPRIV__VERSIONS__RIDGE__3__TEACHERS__DEADLINE_MS", "70"),
    ])?;
    let named: Vec<(&str, &str)> = s.models().map(|m| (m.name.as_str(), m.version.as_str())).collect();
    // Every version 1 first (a dataset's first model is one), then the versions.
    assert_eq!(named, [("private", "1"), ("bayes", "1"), ("ridge", "1"), ("private", "2"), ("ridge", "3")]);
    let version = |name: &str, v: &str| s.models().find(|m| m.name == name && m.version == v).cloned();
    let private2 = version("private", "2").ok_or_else(|| err("test", "no private 2"))?;
    assert!(matches!(private2.teachers, TeacherSource::Demo { models: 16, regularisation: 0.5, .. }));
    assert_eq!(
        (&private2.dataset, private2.mode, &private2.input_shape),
        (&s.model.dataset, s.model.mode, &s.model.input_shape)
    );
    let ridge3 = version("ridge", "3").ok_or_else(|| err("test", "no ridge 3"))?;
    // Over the model's own keys, not only the top-level sections'.
    assert!(matches!(ridge3.teachers, TeacherSource::Demo { regularisation: 2.5, .. }));
    assert_eq!(ridge3.call.deadline, Duration::from_millis(70));
    Ok(())
}

#[test]
fn a_version_that_is_not_one_is_refused_naming_its_key() {
    for (env, key) in [
        (vec![("PACPRIV__VERSIONS__PRIVATE__1__DEMO__REGULARISATION", "0.5")], "versions.private.1"),
        (vec![("PACPRIV__VERSIONS__PRIVATE__02__DEMO__REGULARISATION", "0.5")], "versions.private.02"),
        (vec![("PACPRIV__VERSIONS__PRIVATE__V2__DEMO__REGULARISATION", "0.5")], "versions.private.v2"),
        (vec![("PACPRIV__VERSIONS__NOSUCH__2__DEMO__REGULARISATION", "0.5")], "versions.nosuch"),
        // The demo's naive Bayes model is the default's teachers refitted.
        (vec![("PACPRIV__VERSIONS__BAYES__2__DEMO__REGULARISATION", "0.5")], "versions.bayes"),
        // The same teachers as version 1: not a retrained model.
        (vec![("PACPRIV__VERSIONS__PRIVATE__2__DEMO__MODELS", "128")], "versions.private.2.teachers"),
        // Two versions with the same teachers.
        (
            vec![
                ("PACPRIV__VERSIONS__PRIVATE__2__DEMO__REGULARISATION", "0.5"),
                ("PACPRIV__VERSIONS__PRIVATE__3__DEMO__REGULARISATION", "0.5"),
            ],
            "versions.private.3.teachers",
        ),
        // Another m, another seed: not the same subsets.
        (vec![("PACPRIV__VERSIONS__PRIVATE__2__DEMO__MODELS", "64")], "versions.private.2.demo.models"),
        (vec![("PACPRIV__VERSIONS__PRIVATE__2__DEMO__SEED", "7")], "versions.private.2.demo"),
        // A version's input and output are its model's.
        (vec![("PACPRIV__VERSIONS__PRIVATE__2__MODEL__MODE", "vector")], "versions"),
    ] {
        match load(&env) {
            Ok(_) => panic!("{env:?} loaded"),
            Err(e) => assert!(e.key.starts_with(key), "{env:?}: {e}"),
        }
    }
}

/// A model's `teachers.stacked` replaces `[teachers]`'s table whole: the
/// keys a `[teachers]` table may leave out, it may too (the cluster test's
/// reload found `version` required).
#[test]
fn a_models_stacked_teachers_take_the_same_optional_keys() -> Result<(), SettingsError> {
    let dir = tempfile::tempdir().map_err(|e| err("test", e.to_string()))?;
    let file = dir.path().join("m.toml");
    let toml = "[teachers]\nsource = \"remote\"\nlayout = \"stacked\"\n\
                stacked = { endpoint = \"http://10.0.0.5:8001\", model = \"digits-ensemble\", models = 128 }\n\n\
                [models.ridge]\n\
                teachers = { stacked = { endpoint = \"http://10.0.0.6:8001\", model = \"digits-ensemble\", models = 128 } }\n";
    std::fs::write(&file, toml).map_err(|e| err("test", e.to_string()))?;
    let s = Settings::load_with_env(Some(&file), std::iter::empty())?;
    assert_eq!(s.more_models.iter().map(|m| (m.name.as_str(), m.teachers.m())).collect::<Vec<_>>(), [("ridge", 128)]);
    Ok(())
}

/// A principal's own budget in a further dataset: refused, naming the key,
/// for the default dataset (its limit is budget_mi), an unknown one, a
/// value that is not nats, and a dataset of global scope (whose one
/// session every principal shares).
#[test]
fn a_principal_has_its_own_budget_in_a_further_dataset() -> Result<(), SettingsError> {
    let base = [
        ("PACPRIV__DATASETS__FASHION__PER_QUERY_MI", "2^-10"),
        ("PACPRIV__MODELS__NB__DATASET", "fashion"),
        ("PACPRIV__MODELS__NB__DEMO__SEED", "7"),
        ("PACPRIV__MODELS__NB__DEMO__MODELS", "32"),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", ""),
        ("PACPRIV__PRINCIPALS__TINY__KEY_SHA256", "abababababababababababababababababababababababababababababababab"),
        ("PACPRIV__PRINCIPALS__TINY__BUDGET_MI", "0.25"),
    ];
    let own = ("PACPRIV__PRINCIPALS__TINY__DATASET_BUDGET_MI__FASHION", "2^-12");
    let s = load(&[&base[..], &[own]].concat())?;
    let tiny = s.principals.iter().find(|p| p.name == "tiny").expect("tiny");
    let budgets: Vec<(&str, f64)> = tiny.dataset_budgets.iter().map(|(d, b)| (d.as_str(), b.get())).collect();
    assert_eq!((tiny.budget.get(), budgets), (0.25, vec![("fashion", 2f64.powi(-12))]));

    let refused: &[(&[(&str, &str)], &str)] = &[
        (
            &[("PACPRIV__PRINCIPALS__TINY__DATASET_BUDGET_MI__DEFAULT", "1")],
            "principals.tiny.dataset_budget_mi.default",
        ),
        (
            &[("PACPRIV__PRINCIPALS__TINY__DATASET_BUDGET_MI__FASHOIN", "1")],
            "principals.tiny.dataset_budget_mi.fashoin",
        ),
        (
            &[("PACPRIV__PRINCIPALS__TINY__DATASET_BUDGET_MI__FASHION", "-1")],
            "principals.tiny.dataset_budget_mi.fashion",
        ),
        (&[own, ("PACPRIV__DATASETS__FASHION__SCOPE", "global")], "principals.tiny.dataset_budget_mi.fashion"),
    ];
    for (added, key) in refused {
        let env: Vec<(&str, &str)> = base.iter().chain(added.iter()).copied().collect();
        match load(&env) {
            Ok(_) => panic!("{env:?} was accepted"),
            Err(e) => assert_eq!(e.key, *key, "{env:?}: {e}"),
        }
    }
    Ok(())
}

/// Issue 67 §1: the published demo key is for a server only its own
/// machine can reach. With a client listener off loopback (the image's
/// 0.0.0.0) a principal holding it refuses the start, naming the key, the
/// listener and both ways out; a key of one's own, or the principal
/// removed (`enabled = false`, also from a --config file), starts.
#[test]
fn the_published_demo_key_is_refused_off_loopback() -> Result<(), SettingsError> {
    for (listener, value) in
        [("PACPRIV__SERVER__LISTEN", "0.0.0.0:50051"), ("PACPRIV__SERVER__HTTP_LISTEN", "[::]:8000")]
    {
        let Err(e) = load(&[(listener, value)]) else { panic!("{listener} = {value} served the published key") };
        let said = e.to_string();
        assert_eq!(e.key, "principals.demo.key_sha256", "{said}");
        for part in
            ["\"demo-key\"", value, "PACPRIV__PRINCIPALS__DEMO__KEY_SHA256", "PACPRIV__PRINCIPALS__DEMO__ENABLED"]
        {
            assert!(said.contains(part), "{part}: {said}");
        }
    }
    let off = ("PACPRIV__SERVER__LISTEN", "0.0.0.0:50051");
    let own = load(&[off, ("PACPRIV__PRINCIPALS__DEMO__KEY_SHA256", &"ab".repeat(32))])?;
    assert_eq!(own.principals.len(), 1);
    let alice = [
        ("PACPRIV__PRINCIPALS__ALICE__KEY_SHA256", "cd".repeat(32)),
        ("PACPRIV__PRINCIPALS__ALICE__BUDGET_MI", "1".into()),
    ];
    let mut env: Vec<(&str, &str)> = alice.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend([off, ("PACPRIV__PRINCIPALS__DEMO__ENABLED", "false")]);
    let removed = load(&env)?;
    assert_eq!(removed.principals.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["alice"]);
    // On loopback (the shipped default) the demo key serves.
    assert_eq!(load(&[])?.principals[0].name, "demo");

    // A --config file removes it too.
    let dir = tempfile::tempdir().map_err(|e| err("test", e.to_string()))?;
    let file = dir.path().join("p.toml");
    let toml = format!(
        "[server]\nlisten = \"0.0.0.0:50051\"\n\n[principals.demo]\nenabled = false\n\n[principals.alice]\n\
         key_sha256 = \"{}\"\nbudget_mi = \"1\"\n",
        "cd".repeat(32)
    );
    std::fs::write(&file, toml).map_err(|e| err("test", e.to_string()))?;
    let s = Settings::load_with_env(Some(&file), std::iter::empty())?;
    assert_eq!(s.principals.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["alice"]);
    Ok(())
}
