//! The cluster under test, through the `docker` and `docker-compose`
//! commands: one Compose project (its own name, so runs never meet), torn
//! down with its networks and volumes when dropped, panic or not.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Whether a Docker engine answers; if not, why.
pub fn engine() -> Result<(), String> {
    let out = Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(format!("cannot run `docker`: {e}")),
    }
}

/// The cluster tests' turn: one project at a time (two would share the
/// two cores). Poison is ignored:
/// a test that failed has torn its project down.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Two /24 networks (their first three octets) for `db` and `dcs` that
/// overlap no network the Docker engine has — one left behind by a run
/// that was killed, or another checkout's cluster test, included. The
/// search starts at an offset from the process id, so two runs starting
/// at once rarely race for the same pair.
fn free_subnets() -> [String; 2] {
    let ids = run(Command::new("docker").args(["network", "ls", "-q"]));
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout).split_whitespace().map(str::to_owned).collect();
    let mut taken: Vec<(u32, u32)> = Vec::new();
    if !ids.is_empty() {
        let out = run(Command::new("docker")
            .args(["network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}"])
            .args(&ids));
        taken = String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(ipv4_net).collect();
    }
    let free = |third: u32| {
        let net = (10 << 24) | (241 << 16) | (third << 8);
        taken.iter().all(|&(other, mask)| {
            // They overlap where the shorter prefix of the two agrees.
            let mask = mask.min(0xffff_ff00);
            net & mask != other & mask
        })
    };
    // Even third octets 2..=252: the pair (k, k + 1).
    let start = std::process::id() % 126;
    let k = (0..126)
        .map(|i| 2 + 2 * ((start + i) % 126))
        .find(|&k| free(k) && free(k + 1))
        .expect("no free pair of /24s in 10.241.0.0/16 on this Docker engine");
    [format!("10.241.{k}"), format!("10.241.{}", k + 1)]
}

/// `a.b.c.d/len` as (network address, mask); `None` for IPv6.
fn ipv4_net(cidr: &str) -> Option<(u32, u32)> {
    let (addr, len) = cidr.split_once('/')?;
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len.min(32)) };
    Some((u32::from(addr) & mask, mask))
}

/// Whether container `id`'s health check reports healthy within `within`
/// (false, for the caller to say why, if Docker cannot tell).
pub fn healthy(id: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let out = Command::new("docker").args(["inspect", "-f", "{{.State.Health.Status}}", id]).output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "healthy") {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Container `id`'s state as Docker keeps it (JSON): running or exited
/// with what code, and its last health probes with their output — what a
/// failed wait needs to say, beyond the logs.
pub fn state(id: &str) -> String {
    let out = Command::new("docker").args(["inspect", "-f", "{{json .State}}", id]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        .unwrap_or_else(|e| format!("docker inspect: {e}"))
}

/// Runs `cmd`, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A Compose project running `tests/cluster/compose.yaml`.
pub struct Project {
    name: String,
    file: PathBuf,
    /// The interpolated variables (`PACPRIV_CLUSTER_DIR`, …).
    vars: Vec<(String, String)>,
}

impl Project {
    /// A project of its own (named for this process and a count), run
    /// only while `_turn` — [`one_at_a_time`]'s guard — is held.
    pub fn new(file: &Path, dir: &Path, _turn: &MutexGuard<'static, ()>) -> Project {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let [db, dcs] = free_subnets();
        Project {
            name: format!("pacpriv-cluster-{}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed)),
            file: file.to_owned(),
            vars: vec![
                ("PACPRIV_CLUSTER_DIR".into(), dir.display().to_string()),
                ("PACPRIV_DB_NET".into(), db),
                ("PACPRIV_DCS_NET".into(), dcs),
            ],
        }
    }

    /// The fixed address `host` (e.g. 21 for pg-1) on the project's
    /// `network` (`db` or `dcs`).
    pub fn address(&self, network: &str, host: u8) -> String {
        let var = match network {
            "db" => "PACPRIV_DB_NET",
            "dcs" => "PACPRIV_DCS_NET",
            other => panic!("no fixed addresses on network {other}"),
        };
        let net = self.vars.iter().find(|(k, _)| k == var).map(|(_, v)| v.as_str()).unwrap_or_default();
        format!("{net}.{host}")
    }

    /// Sets an interpolated variable for later commands.
    pub fn set(&mut self, var: &str, value: &str) {
        self.vars.retain(|(k, _)| k != var);
        self.vars.push((var.into(), value.into()));
    }

    /// `docker-compose -p NAME -f FILE args…`.
    pub fn compose(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.args(["--ansi", "never", "-p", &self.name, "-f"]).arg(&self.file).args(args);
        cmd.envs(self.vars.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// The container running `service`.
    pub fn container(&self, service: &str) -> String {
        let out = run(&mut self.compose(&["ps", "-q", service]));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!id.is_empty(), "no container for {service}");
        id
    }

    /// The name Compose gives `service`'s (one) container, known without
    /// asking it.
    pub fn container_name(&self, service: &str) -> String {
        format!("{}_{service}_1", self.name)
    }

    /// The name Docker gave `network` of this project.
    pub fn network(&self, network: &str) -> String {
        format!("{}_{network}", self.name)
    }

    /// Waits until every one of `services` reports healthy (their Compose
    /// health checks: the same probe as the Deployment's).
    pub fn wait_healthy(&self, services: &[&str], within: Duration) {
        let deadline = Instant::now() + within;
        for service in services {
            let id = self.container(service);
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                healthy(&id, left),
                "{service} not healthy within {within:?}:\n{}\nits state (the last health probes' output in Health.Log):\n{}",
                self.logs(service),
                state(&id)
            );
        }
    }

    /// The last lines `service` logged.
    pub fn logs(&self, service: &str) -> String {
        let out = self.compose(&["logs", "--no-color", "--tail", "40", service]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    /// Starts the load generator with `args`; its standard output (one
    /// JSON line per query) is read by [`Load::finish`].
    pub fn load(&self, args: &[String]) -> Load {
        let mut cmd = self.compose(&["run", "--rm", "-T", "loadgen"]);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        Load { child: cmd.spawn().expect("docker-compose run loadgen"), started: Instant::now() }
    }

    /// `psql` in the database container `service`: rows of `sql`, columns
    /// split on spaces.
    pub fn sql(&self, service: &str, db: &str, sql: &str) -> Vec<Vec<String>> {
        let out =
            run(&mut self
                .compose(&["exec", "-T", service, "psql", "-U", "pacpriv", "-d", db, "-At", "-F", " ", "-c", sql]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| l.split(' ').map(str::to_owned).collect())
            .collect()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if std::env::var_os("PACPRIV_CLUSTER_KEEP").is_some() {
            eprintln!(
                "PACPRIV_CLUSTER_KEEP: left running: docker-compose -p {} -f {} …",
                self.name,
                self.file.display()
            );
            return;
        }
        let _ = self
            .compose(&["--profile", "load", "--profile", "models", "down", "-v", "--remove-orphans", "-t", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A running load generator.
pub struct Load {
    child: Child,
    pub started: Instant,
}

impl Load {
    /// Waits for it to end; its JSON lines.
    pub fn finish(self) -> Vec<serde_json::Value> {
        let out = self.child.wait_with_output().expect("load generator");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "load generator failed: {stderr}");
        eprintln!("{}", stderr.trim());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}
