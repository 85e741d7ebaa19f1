//! A private Postgres cluster in a local folder, booted from the installed Postgres binaries:
//! the embedded default of `relay dev`, `relay bench` and the test harness when no
//! `DATABASE_URL` is given. Nothing is downloaded.
//!
//! Postgres refuses to run as root, so as root every Postgres command runs as the `postgres`
//! user (`runuser`), on a folder that user owns.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// How the cluster trades durability for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Postgres defaults: what `relay dev` and benchmarks use.
    Full,
    /// fsync off: for throwaway test clusters only.
    Throwaway,
}

#[derive(Debug, Clone)]
pub struct PrivateCluster {
    pub data_dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
    as_postgres: bool,
    /// The server options it was started with (`resume` starts it again with them).
    options: String,
}

const INSTALL_HINT: &str = "no Postgres server binaries found (initdb, pg_ctl). Install them \
    (Debian/Ubuntu: `apt install postgresql`; macOS: `brew install postgresql@15`), set \
    PG_BIN to their folder, or set DATABASE_URL to an existing database";

/// The folder holding `initdb` and `pg_ctl`: `PG_BIN`, then `pg_config --bindir`, then the
/// newest `/usr/lib/postgresql/*/bin`, then `PATH`.
pub fn find_binaries() -> anyhow::Result<PathBuf> {
    let has = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(dir) = std::env::var("PG_BIN") {
        let dir = PathBuf::from(dir);
        if has(&dir) {
            return Ok(dir);
        }
        bail!("PG_BIN={} holds no initdb and pg_ctl", dir.display());
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p)| has(p))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).find(|d| has(d))).context(INSTALL_HINT)
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

impl PrivateCluster {
    /// Start the cluster in `dir` (creating it on first use), or attach to it when it already
    /// runs. Listens on 127.0.0.1 on a free port, and on a socket inside `dir`.
    pub fn start(dir: &Path, durability: Durability) -> anyhow::Result<Self> {
        Self::start_with(dir, durability, "")
    }

    /// `start`, with extra server options (e.g. `-c shared_preload_libraries=...`) used when
    /// this call starts the server.
    pub fn start_with(dir: &Path, durability: Durability, extra_options: &str) -> anyhow::Result<Self> {
        Self::init(dir)?.launch(durability, extra_options, None)
    }

    /// `start`, on `port` when it is given and free (a stable address for `relay dev`);
    /// on another free port otherwise (compare `port` of the result).
    pub fn start_on(dir: &Path, durability: Durability, port: Option<u16>) -> anyhow::Result<Self> {
        Self::init(dir)?.launch(durability, "", port)
    }

    /// `start`, with TLS on (`ssl=on`, the given PEM certificate chain and key) and password
    /// authentication (SCRAM) over TCP for every role but `postgres`, which stays trusted:
    /// a cluster shaped like RDS for the TLS and secret-rotation tests.
    pub fn start_tls(dir: &Path, durability: Durability, cert_pem: &str, key_pem: &str) -> anyhow::Result<Self> {
        let cluster = Self::init(dir)?;
        let hba = "local all all trust\n\
                   host all postgres 127.0.0.1/32 trust\n\
                   host all all 127.0.0.1/32 scram-sha-256\n";
        for (name, text) in [("server.crt", cert_pem), ("server.key", key_pem), ("relay_hba.conf", hba)] {
            let path = cluster.data_dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            if cluster.as_postgres {
                let mut chown = Command::new("chown");
                chown.arg("postgres:postgres").arg(&path);
                run(chown)?;
            }
        }
        let hba_file = cluster.data_dir.join("relay_hba.conf");
        cluster.launch(
            durability,
            &format!(
                "-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c hba_file={} \
                 -c password_encryption=scram-sha-256",
                hba_file.display()
            ),
            None,
        )
    }

    /// The binaries, the folder (owned by `postgres` when we are root) and `initdb` on first use.
    fn init(dir: &Path) -> anyhow::Result<Self> {
        let bin = find_binaries()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let data_dir = std::fs::canonicalize(dir)?;
        let as_postgres = running_as_root();
        let cluster = PrivateCluster { data_dir, port: 0, bin, as_postgres, options: String::new() };
        if cluster.as_postgres {
            let mut chown = Command::new("chown");
            chown.args(["-R", "postgres:postgres"]).arg(&cluster.data_dir);
            run(chown)?;
        }
        if !cluster.data_dir.join("PG_VERSION").exists() {
            let mut initdb = cluster.pg("initdb");
            initdb.arg("-D").arg(&cluster.data_dir);
            initdb.args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]);
            run(initdb)?;
        }
        Ok(cluster)
    }

    /// Attach to the server running on this folder, or start it with `extra_options` (on
    /// `port` when given and free).
    fn launch(mut self, durability: Durability, extra_options: &str, port: Option<u16>) -> anyhow::Result<Self> {
        if let Some(port) = self.running_port() {
            self.port = port;
            self.options = self.base_options();
            return Ok(self);
        }
        self.port = match port.filter(|p| *p != 0 && TcpListener::bind(("127.0.0.1", *p)).is_ok()) {
            Some(p) => p,
            None => free_port()?,
        };
        let mut opts = self.base_options();
        if !extra_options.is_empty() {
            opts.push(' ');
            opts.push_str(extra_options);
        }
        if durability == Durability::Throwaway {
            opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        self.options = opts;
        self.resume()?;
        Ok(self)
    }

    fn base_options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300 -c shared_buffers=256MB",
            self.port,
            self.data_dir.display()
        )
    }

    /// Start the server (again) on its port with its options: after `stop`, clients that
    /// kept its URL reconnect to the same place.
    pub fn resume(&self) -> anyhow::Result<()> {
        let log = self.data_dir.join("server.log");
        let mut start = self.pg("pg_ctl");
        start.arg("-D").arg(&self.data_dir).arg("-l").arg(&log);
        start.args(["-w", "-t", "60", "-o", &self.options, "start"]);
        run(start).with_context(|| format!("starting Postgres; see {}", log.display()))
    }

    /// The URL of a database in this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stop the cluster (fast shutdown: sessions end, committed data stays).
    pub fn stop(&self) -> anyhow::Result<()> {
        let mut stop = self.pg("pg_ctl");
        stop.arg("-D").arg(&self.data_dir).args(["-m", "fast", "-w", "stop"]);
        run(stop)
    }

    /// Stop the cluster once process `pid` has exited (for test runs, which have no hook at
    /// exit). A detached shell watches the pid. Each process that uses the cluster registers
    /// (a file named by its pid beside the data folder), and the cluster is stopped only when
    /// no registered process still runs a few seconds after `pid` exited: a test run started
    /// right after another reuses the running cluster, which the first run's watchdog then
    /// leaves alone.
    pub fn stop_when_process_exits(&self, pid: u32) -> anyhow::Result<()> {
        let users = self.data_dir.with_extension("users");
        std::fs::create_dir_all(&users).context("creating the cluster's users folder")?;
        std::fs::write(users.join(pid.to_string()), b"").context("registering with the cluster")?;
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = format!(
            "rm -f '{users}/{pid}'; sleep 3; \
             for f in '{users}'/*; do [ -e \"$f\" ] || continue; \
               if kill -0 \"$(basename \"$f\")\" 2>/dev/null; then exit 0; else rm -f \"$f\"; fi; done; \
             {prefix}{} -D '{}' -m fast stop >/dev/null 2>&1",
            pg_ctl.display(),
            self.data_dir.display(),
            users = users.display(),
            prefix = if self.as_postgres { "runuser -u postgres -- " } else { "" },
        );
        crate::watchdog::when_process_exits(pid, &stop).context("spawning the cluster watchdog")?;
        Ok(())
    }

    /// The port of the postmaster running on this folder, if one runs.
    fn running_port(&self) -> Option<u16> {
        let status = self
            .pg("pg_ctl")
            .arg("-D")
            .arg(&self.data_dir)
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
        // postmaster.pid: line 4 is the port.
        let pid_file = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        pid_file.lines().nth(3)?.trim().parse().ok()
    }

    /// A Postgres program, run as the `postgres` user when we are root.
    fn pg(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }
}

/// Run a command to completion; its stderr becomes the error.
fn run(mut cmd: Command) -> anyhow::Result<()> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd.get_program(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
