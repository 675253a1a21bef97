//! Helpers shared by the integration tests; [`faulty`] is the
//! fault-injecting teacher proxy.

#[path = "../../shared/certificate.rs"]
pub mod certificate;
pub mod faulty;
pub mod pg_proxy;

use std::process::{Command, Output};

/// Runs the `pacpriv` binary built for this test run with `args`.
pub fn pacpriv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pacpriv")).args(args).output().expect("the pacpriv binary runs")
}

/// The auditor's verifier, `pacpriv-verify` (`crates/verify`), built
/// beside `pacpriv` by the test command.
pub fn pacpriv_verify_binary() -> std::path::PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_pacpriv")).with_file_name("pacpriv-verify");
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p pacpriv-verify` (and the test run's profile)",
        path.display()
    );
    path
}

/// Runs `pacpriv verify ARGS` and `pacpriv-verify ARGS` with `env`, and
/// checks they answer alike: the same report, errors and exit status (a
/// usage error names its program). `pacpriv`'s output.
pub fn both_verifiers(args: &[&str], env: &[(&str, &str)]) -> Output {
    let run = |program: &Path, args: &[&str]| {
        let mut command = Command::new(program);
        command.args(args).envs(env.iter().copied());
        command.output().unwrap_or_else(|e| panic!("{} runs: {e}", program.display()))
    };
    let ours = run(Path::new(env!("CARGO_BIN_EXE_pacpriv")), &[&["verify"], args].concat());
    let auditors = run(&pacpriv_verify_binary(), args);
    // OpenBLAS's own line (`OPENBLAS_VERBOSE`) comes once per load, and
    // `pacpriv` may load it twice, re-executing itself for its allocator.
    let seen = |o: &Output| {
        let text = |b: &[u8]| String::from_utf8_lossy(b).replace("pacpriv verify", "pacpriv-verify");
        let stderr: Vec<String> =
            text(&o.stderr).lines().filter(|l| !l.starts_with("Core: ")).map(str::to_owned).collect();
        (o.status.code(), text(&o.stdout), stderr)
    };
    assert_eq!(seen(&auditors), seen(&ours), "pacpriv-verify {args:?} answered otherwise than pacpriv verify");
    ours
}

/// [`both_verifiers`] on the kernels OpenBLAS chooses itself: `pacpriv`
/// would otherwise ask for the CPU's widest, and an update's slack
/// follows the kernels in its last digits
/// (`verify::an_export_verifies_the_same_on_other_openblas_kernels` runs
/// both on each).
pub fn pacpriv_verify(args: &[&str]) -> Output {
    both_verifiers(args, &[(pacpriv::cli::startup::REEXECUTED, "1")])
}

/// Runs `pacpriv` and returns stdout, failing the test with stderr if the
/// command did not succeed.
pub fn pacpriv_ok(args: &[&str]) -> String {
    succeeded("pacpriv", args, pacpriv(args))
}

/// Runs the benchmark driver `pacpriv-bench` (`benches/driver/`) and
/// returns stdout, failing the test with stderr if it did not succeed.
pub fn bench_ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pacpriv-bench")).args(args).output().expect("pacpriv-bench runs");
    succeeded("pacpriv-bench", args, out)
}

fn succeeded(program: &str, args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse, Tensor};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// A `pacpriv` process (serve or teachers) that is killed when dropped.
pub struct Process {
    child: Child,
    /// The address it printed once ready.
    pub addr: String,
    /// Everything it printed on standard output so far.
    stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    stderr: tempfile::NamedTempFile,
    /// A private store directory, unless the test chose the store path.
    _state: Option<tempfile::TempDir>,
    /// Its "`ready` ADDR" line's address, until [`Process::wait_ready`].
    ready: mpsc::Receiver<String>,
    args: Vec<String>,
}

/// Where a process's standard error goes: straight to the file
/// [`Process::logs`] reads, or through a pipe a thread copies to it.
#[derive(Clone, Copy)]
enum Logs {
    File,
    Pipe,
}

impl Process {
    /// Starts `pacpriv args` with `env` and waits (at most 120 s) for its
    /// "`ready` ADDR" line on standard output.
    pub fn start(args: &[&str], env: &[(&str, String)], ready: &str) -> Process {
        Process::start_program(Path::new(env!("CARGO_BIN_EXE_pacpriv")), args, env, ready)
    }

    /// As [`Process::start`], for another program built from this package.
    pub fn start_program(program: &Path, args: &[&str], env: &[(&str, String)], ready: &str) -> Process {
        let mut p = Process::spawn(program, args, env, ready, Logs::File);
        p.wait_ready();
        p
    }

    /// Waits (at most 120 s) for the "`ready` ADDR" line of a process
    /// started without waiting ([`Process::serve_unready`]).
    pub fn wait_ready(&mut self) {
        match self.ready.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => self.addr = addr,
            Err(_) => panic!("pacpriv {:?} did not become ready:\n{}", self.args, self.logs()),
        }
    }

    /// Starts `program args` with `env`, not waiting for anything.
    fn spawn(program: &Path, args: &[&str], env: &[(&str, String)], ready: &str, logs: Logs) -> Process {
        let stderr = tempfile::NamedTempFile::new().expect("temp file");
        let mut cmd = Command::new(program);
        cmd.args(args).env("OPENBLAS_NUM_THREADS", "1").stdin(Stdio::null()).stdout(Stdio::piped());
        match logs {
            Logs::File => cmd.stderr(stderr.reopen().expect("stderr file")),
            Logs::Pipe => cmd.stderr(Stdio::piped()),
        };
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("pacpriv starts");
        if let Some(mut pipe) = child.stderr.take() {
            let mut file = stderr.reopen().expect("stderr file");
            std::thread::spawn(move || std::io::copy(&mut pipe, &mut file));
        }
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let prefix = format!("{ready} ");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = std::sync::Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix(&prefix) {
                    let _ = tx.send(addr.trim().to_owned());
                }
                seen.lock().expect("stdout lines").push(line);
            }
        });
        let args = args.iter().map(|&a| a.to_owned()).collect();
        Process { child, addr: String::new(), stdout: lines, stderr, _state: None, ready: rx, args }
    }

    /// `pacpriv serve` with the built-in config, `--config` files and
    /// environment overrides, on a free loopback port, with a store of its
    /// own unless `env` sets `PACPRIV__STORE__PATH`.
    pub fn serve(config: Option<&std::path::Path>, env: &[(&str, String)]) -> Process {
        Process::serve_program(Path::new(env!("CARGO_BIN_EXE_pacpriv")), config, env)
    }

    /// As [`Process::serve`], with `program` in place of `pacpriv` (a
    /// program that serves as `pacpriv serve` does, e.g. the canary audit's
    /// deliberately broken `examples/undernoised.rs`).
    pub fn serve_program(program: &Path, config: Option<&std::path::Path>, env: &[(&str, String)]) -> Process {
        let mut p = Process::serve_unready(program, config, env);
        p.wait_ready();
        p
    }

    /// As [`Process::serve`], its log copied to [`Process::logs`] by a
    /// thread of the test: what the process writes itself is then only the
    /// store (for a test that limits the size of the files it writes).
    /// A line may reach [`Process::logs`] a moment after the process wrote
    /// it.
    pub fn serve_logging_through_a_pipe(config: Option<&std::path::Path>, env: &[(&str, String)]) -> Process {
        let program = Path::new(env!("CARGO_BIN_EXE_pacpriv"));
        let mut p = Process::serve_unready_with(program, config, env, Logs::Pipe);
        p.wait_ready();
        p
    }

    /// As [`Process::serve_program`], returning at once: [`Process::wait_ready`]
    /// waits for the address.
    pub fn serve_unready(program: &Path, config: Option<&std::path::Path>, env: &[(&str, String)]) -> Process {
        Process::serve_unready_with(program, config, env, Logs::File)
    }

    fn serve_unready_with(
        program: &Path,
        config: Option<&std::path::Path>,
        env: &[(&str, String)],
        logs: Logs,
    ) -> Process {
        let mut env = env.to_vec();
        env.push(("PACPRIV__SERVER__LISTEN", "127.0.0.1:0".into()));
        // The test binary's fan-out variant (batched, unbatched, stacked),
        // unless the test chose otherwise.
        for (key, value) in crate::FANOUT {
            if !env.iter().any(|(k, _)| k == key) {
                env.push((key, (*value).to_owned()));
            }
        }
        // Extra listeners on free ports too, so tests can run side by side.
        for key in ["PACPRIV__METRICS__LISTEN", "PACPRIV__ADMIN__LISTEN", "PACPRIV__SERVER__HTTP_LISTEN"] {
            if !env.iter().any(|(k, _)| *k == key) {
                env.push((key, "127.0.0.1:0".into()));
            }
        }
        let state = if env.iter().any(|(k, _)| *k == "PACPRIV__STORE__PATH") {
            None
        } else {
            let dir = tempfile::tempdir().expect("temp dir");
            env.push(("PACPRIV__STORE__PATH", dir.path().join("state.redb").display().to_string()));
            Some(dir)
        };
        let config = config.map(|p| p.display().to_string());
        let mut args = vec!["serve"];
        if let Some(c) = &config {
            args.extend(["--config", c.as_str()]);
        }
        // A program other than pacpriv takes no subcommand.
        if program != Path::new(env!("CARGO_BIN_EXE_pacpriv")) {
            args.remove(0);
        }
        let mut p = Process::spawn(program, &args, &env, "pacpriv listening on", logs);
        p._state = state;
        p
    }

    /// `pacpriv teachers`: m demo models trained with `seed`, on a free
    /// loopback port, their `[teachers]` list written to `config` (for
    /// `serve --config`).
    pub fn teachers(models: usize, seed: u64, config: &std::path::Path) -> Process {
        let (models, seed, config) = (models.to_string(), seed.to_string(), config.display().to_string());
        let args =
            ["teachers", "--models", &models, "--seed", &seed, "--listen", "127.0.0.1:0", "--write-config", &config];
        Process::start(&args, &[], "teachers listening on")
    }

    /// `pacpriv teachers`: m demo models trained with `seed`, listening on
    /// `listen` (`127.0.0.1:0` for a free port; an address it had before
    /// to bring killed teachers back).
    pub fn teachers_at(models: usize, seed: u64, listen: &str) -> Process {
        let (models, seed) = (models.to_string(), seed.to_string());
        Process::start(
            &["teachers", "--models", &models, "--seed", &seed, "--listen", listen],
            &[],
            "teachers listening on",
        )
    }

    /// The address of the extra listener `what` ("admin", "health",
    /// "metrics"), from its `pacpriv WHAT listening on ADDR` line.
    pub fn listener(&self, what: &str) -> String {
        let prefix = format!("pacpriv {what} listening on ");
        for _ in 0..100 {
            let lines = self.stdout.lock().expect("stdout lines").clone();
            if let Some(addr) = lines.iter().find_map(|l| l.strip_prefix(&prefix)) {
                return addr.trim().to_owned();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no {what} listener announced:\n{}", self.logs())
    }

    /// Runs `pacpriv admin ARGS` against this server's admin listener
    /// with [`ADMIN_TOKEN`].
    pub fn admin_cli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_pacpriv"))
            .args(["admin", "--addr", &self.listener("admin")])
            .args(args)
            .env("PACPRIV_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .expect("pacpriv admin runs")
    }

    /// Everything it logged so far, read once its log has not grown for
    /// 100 ms (at most 2 s): the server writes its `info` lines out every
    /// 10 ms (`trace::Lines`), and a test that looks for a line, or for
    /// its absence, must see what was logged before it looked.
    pub fn logs(&self) -> String {
        let size = || std::fs::metadata(self.stderr.path()).map_or(0, |m| m.len());
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut seen = size();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let now = size();
            if now == seen || Instant::now() >= deadline {
                break;
            }
            seen = now;
        }
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `signal` ("STOP", "CONT", ...) with kill(1).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let ok = Command::new("kill").args([&format!("-{signal}"), &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid}");
    }

    /// Waits up to `timeout` for it to exit on its own; its exit status.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills it now (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls the health of pacpriv.v1.Privatizer for up to 20 s until it is `want`.
pub async fn health_becomes(addr: &str, want: tonic_health::pb::health_check_response::ServingStatus) -> bool {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for _ in 0..200 {
        let req = tonic_health::pb::HealthCheckRequest { service: "pacpriv.v1.Privatizer".into() };
        if health.check(req).await.is_ok_and(|r| r.into_inner().status == want as i32) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

/// The admin token the tests configure (as its hash, with [`key_hash`]).
pub const ADMIN_TOKEN: &str = "admin-token-for-tests";

/// `message` with `authorization: Bearer <token>`.
pub fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ascii"));
    req
}

/// A connected admin API stub.
pub async fn admin_client(addr: &str) -> pacpriv_service::proto::pacpriv::admin_client::AdminClient<Channel> {
    pacpriv_service::proto::pacpriv::admin_client::AdminClient::connect(format!("http://{addr}"))
        .await
        .expect("connects to the admin listener")
}

/// A connected client API stub.
pub async fn client(addr: &str) -> PrivatizerClient<Channel> {
    PrivatizerClient::connect(format!("http://{addr}")).await.expect("connects to pacpriv")
}

/// A request carrying `key` as `x-api-key`.
pub fn with_key<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut().insert("x-api-key", key.parse().expect("ascii key"));
    req
}

/// A Predict request for one 64-pixel image.
pub fn image(query_id: &str, pixels: &[f32]) -> PredictRequest {
    PredictRequest {
        query_id: query_id.into(),
        input: Some(Tensor {
            datatype: "FP32".into(),
            shape: vec![64],
            fp32_contents: pixels.to_vec(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Predict with `key`.
pub async fn predict(
    c: &mut PrivatizerClient<Channel>,
    key: &str,
    req: PredictRequest,
) -> Result<PredictResponse, tonic::Status> {
    c.predict(with_key(req, key)).await.map(tonic::Response::into_inner)
}

/// GetBudget with `key`.
pub async fn budget(c: &mut PrivatizerClient<Channel>, key: &str) -> Budget {
    c.get_budget(with_key(GetBudgetRequest::default(), key)).await.expect("GetBudget").into_inner()
}

/// The SHA-256 hex of an API key, for `PACPRIV__PRINCIPALS__*__KEY_SHA256`.
pub fn key_hash(key: &str) -> String {
    pacpriv_service::session::key_digest_hex(key)
}

/// A private PostgreSQL server (Debian package `postgresql`) in a temp
/// directory, on a free loopback port; stopped when dropped. Started as
/// the `postgres` user when the tests run as root (PostgreSQL refuses
/// root).
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    /// Connection URL.
    pub url: String,
}

impl Postgres {
    /// initdb + pg_ctl start, or a test failure that says what to install.
    pub fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// As [`Postgres::start`], with `ssl = on` serving the certificate and
    /// key `tls` holds (PEM), and plaintext connections refused.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Postgres {
        Postgres::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Postgres {
        let mut bins: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .map(|d| {
                d.filter_map(Result::ok).map(|e| e.path().join("bin")).filter(|p| p.join("pg_ctl").exists()).collect()
            })
            .unwrap_or_default();
        bins.sort();
        let bin = bins.pop().expect("PostgreSQL server binaries: apt-get install postgresql (.ci/run does)");
        let dir = tempfile::tempdir().expect("temp dir");
        let root = is_root();
        if root {
            let uid: u32 =
                String::from_utf8_lossy(&Command::new("id").args(["-u", "postgres"]).output().expect("id").stdout)
                    .trim()
                    .parse()
                    .expect("a postgres user (created by the postgresql package)");
            std::os::unix::fs::chown(dir.path(), Some(uid), None).expect("chown temp dir");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let pg = Postgres { dir, bin, url: format!("postgres://pacpriv@127.0.0.1:{port}/postgres") };
        let data = pg.dir.path().join("data");
        pg.run("initdb", &["-D", &data.display().to_string(), "-A", "trust", "-U", "pacpriv", "--no-sync"], root);
        let mut opts = format!("-c listen_addresses=127.0.0.1 -p {port} -k {}", pg.dir.path().display());
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt;
            for (name, pem) in [("server.crt", cert), ("server.key", key)] {
                let path = data.join(name);
                std::fs::write(&path, pem).expect("write TLS file");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
                if root {
                    let owner = std::fs::metadata(&data).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok();
                    std::os::unix::fs::chown(&path, owner, None).expect("chown TLS file");
                }
            }
            let hba = data.join("pg_hba.conf");
            let rules = std::fs::read_to_string(&hba).expect("pg_hba.conf");
            std::fs::write(&hba, format!("hostnossl all all 0.0.0.0/0 reject\n{rules}")).expect("pg_hba.conf");
            opts.push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        let log = pg.dir.path().join("log");
        pg.run(
            "pg_ctl",
            &["-D", &data.display().to_string(), "-o", &opts, "-l", &log.display().to_string(), "-w", "start"],
            root,
        );
        pg
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// A PostgreSQL tool, as `postgres` when we are root.
    fn tool(&self, tool: &str, root: bool) -> Command {
        let exe = self.bin.join(tool).display().to_string();
        if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &exe]);
            c
        } else {
            Command::new(&exe)
        }
    }

    fn run(&self, tool: &str, args: &[&str], root: bool) {
        let out = self.tool(tool, root).args(args).current_dir(self.dir.path()).output().expect("PostgreSQL tool runs");
        assert!(
            out.status.success(),
            "{tool} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data").display().to_string();
        let _ = self.tool("pg_ctl", is_root()).args(["-D", &data, "-m", "immediate", "stop"]).output();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false)
}

/// The posterior a session's journal implies: the prior over `m` subsets
/// updated with every journaled log-likelihood vector, in order.
pub fn replay(m: usize, journal: &[pacpriv_store::JournalEntry]) -> pacpriv_privacy::posterior::Form {
    let mut posterior = pacpriv_privacy::posterior::Posterior::uniform(m).expect("prior");
    for j in journal.iter().filter(|j| !j.log_likelihood.is_empty()) {
        let rule = pacpriv_privacy::posterior::UpdateRule::from_code(j.update_rule).expect("a known update rule");
        let labels = j.step.as_ref().map(|s| s.labels.as_slice()).unwrap_or_default();
        posterior.update_by(rule, labels, ndarray::ArrayView1::from(&j.log_likelihood)).expect("update");
    }
    posterior.form().clone()
}

/// b of [`small_demo`]: 2^-8, a power of two, so sums of charges are exact.
pub const B: f64 = 1.0 / 256.0;

/// A deterministic 64-pixel input, different for every seed (the answer
/// cache would otherwise answer a repeated one for free).
pub fn digit(seed: u32) -> Vec<f32> {
    distinct((0..64).map(|j| ((seed * 31 + j * 7) % 17) as f32).collect(), seed)
}

/// `pixels` made unique to `n` by fractions added to the first two (16
/// bits of `n` each) — exact in f32, so no two values of `n` give the same
/// query.
pub fn distinct(mut pixels: Vec<f32>, n: u32) -> Vec<f32> {
    pixels[0] += (n & 0xffff) as f32 / 65536.0;
    pixels[1] += (n >> 16) as f32 / 65536.0;
    pixels
}

/// The demo's seed (config/default.toml), hence its split.
pub const DEMO_SEED: u64 = 20261123;

/// The first `n` held-out demo examples: never trained on.
pub fn held_out(n: usize) -> Vec<pacpriv_demo::digits::Example> {
    let test = pacpriv_demo::digits::split(DEMO_SEED).expect("the demo data splits").test;
    test.into_iter().take(n).collect()
}

/// `examples` as a CSV file with a header, what `pacpriv label` reads.
pub fn write_csv(path: &std::path::Path, examples: &[pacpriv_demo::digits::Example]) {
    let mut text: Vec<String> = vec![(0..64).map(|j| format!("p{j}")).collect::<Vec<_>>().join(",")];
    text.extend(examples.iter().map(|e| e.pixels.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")));
    std::fs::write(path, text.join("\n") + "\n").expect("write CSV");
}

/// Environment for a quick demo deployment: 16 teachers, b = [`B`], and a
/// principal "alice" (key `alice-key`, budget 1 nat) beside the demo one.
pub fn small_demo(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__PRINCIPALS__ALICE__KEY_SHA256", key_hash("alice-key")),
        ("PACPRIV__PRINCIPALS__ALICE__BUDGET_MI", "1".to_owned()),
    ];
    env.extend_from_slice(extra);
    env
}

/// `(code, ErrorInfo reason, its "charged" metadata)` of a refusal.
pub fn refusal(e: &tonic::Status) -> (tonic::Code, String, Option<String>) {
    use tonic_types::StatusExt;
    let info = e.get_error_details().error_info().cloned().expect("ErrorInfo");
    (e.code(), info.reason, info.metadata.get("charged").cloned())
}

/// `GET /metrics` from a metrics listener (plain HTTP/1.1), the body.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("metrics listener reachable");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("request sent");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("response read");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "scrape failed: {head}");
    body.to_owned()
}

/// The value of the sample `series` (name with labels, exactly as
/// exposed) in a scrape, if present.
pub fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The Python of the interoperability venv (MLServer, tritonclient), made
/// by `tests/interop_venv.sh` on first use (once per test binary).
pub fn interop_python() -> std::path::PathBuf {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| venv_python("interop_venv.sh", "examples/mlserver/requirements.txt")).clone()
}

/// The Python of the client package's venv (`tests/client_venv.sh`:
/// `pip install ./clients/python`), made on first use.
pub fn client_python() -> std::path::PathBuf {
    static PYTHON: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| venv_python("client_venv.sh", "./clients/python")).clone()
}

/// Runs `tests/SCRIPT`, which pip-installs `what` into a venv and prints
/// its python.
fn venv_python(script: &str, what: &str) -> std::path::PathBuf {
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash").arg(&path).output().expect("bash runs");
    assert!(
        out.status.success(),
        "tests/{script} failed (it pip-installs {what} from PyPI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8").trim().into()
}

/// A loopback port nobody was listening on a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// A third-party child process in its own process group, killed (group and
/// all) when dropped; its output goes to a file for failure messages.
pub struct Peer {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Peer {
    /// Starts `program args`.
    pub fn start(program: &std::path::Path, args: &[&str]) -> Peer {
        use std::os::unix::process::CommandExt;
        let log = tempfile::NamedTempFile::new().expect("temp file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("log file"))
            .stderr(log.reopen().expect("log file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{} starts: {e}", program.display()));
        Peer { child, log }
    }

    /// What it printed so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills its process group and reaps it.
    pub fn kill(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What `curl` got back.
pub struct Reply {
    /// The HTTP status code.
    pub code: u16,
    /// The response's headers, lower-cased.
    pub headers: String,
    /// The body as JSON (a JSON string if it was not JSON).
    pub body: serde_json::Value,
}

/// `curl` `method` `url` with `headers` and a JSON `body`.
pub fn curl(method: &str, url: &str, headers: &[&str], body: Option<&str>) -> Reply {
    let dir = tempfile::tempdir().expect("temp dir");
    let (out, head) = (dir.path().join("body"), dir.path().join("headers"));
    let mut c = std::process::Command::new("curl");
    c.args(["-s", "-X", method, url, "-o"]).arg(&out).arg("-D").arg(&head).args(["-w", "%{http_code}"]);
    for h in headers {
        c.args(["-H", h]);
    }
    if let Some(b) = body {
        let file = dir.path().join("request.json");
        std::fs::write(&file, b).expect("request written");
        c.args(["-H", "Content-Type: application/json", "--data-binary"]).arg(format!("@{}", file.display()));
    }
    let done = c.output().expect("curl runs");
    assert!(done.status.success(), "curl failed: {}", String::from_utf8_lossy(&done.stderr));
    let code = String::from_utf8_lossy(&done.stdout).trim().parse().expect("an HTTP code");
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    Reply { code, headers: std::fs::read_to_string(&head).unwrap_or_default().to_lowercase(), body }
}

/// A KServe v2 request body for `rows` examples, asking for `outputs`.
pub fn request(rows: &[Vec<f32>], outputs: &[&str]) -> String {
    let outputs: Vec<serde_json::Value> = outputs.iter().map(|o| serde_json::json!({ "name": o })).collect();
    serde_json::json!({
        "id": "curl-1",
        "inputs": [{ "name": "input", "shape": [rows.len(), 64], "datatype": "FP32", "data": rows }],
        "outputs": outputs,
    })
    .to_string()
}
