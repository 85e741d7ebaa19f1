//! Python tools from PyPI in venvs of their own, and moto's server mode (the local
//! AWS-protocol server): shared by the test harness and `relay chaos`, so there is one way to
//! install and start them. Nothing here runs in production.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The role `email.send` runs as against moto (its account, 123456789012): moto's STS lets it be
/// assumed without an IAM role of that name.
pub const EMAIL_SEND_ROLE: &str = "arn:aws:iam::123456789012:role/relay-task-email-send";

/// Why a venv or moto's server could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LocalAwsError {
    /// A command that could not run (`cmd` as `Command`'s `Debug` shows it).
    #[error("{cmd}: {error}")]
    Run { cmd: String, error: std::io::Error },
    #[error("{cmd} failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("{0}")]
    Io(std::io::Error),
    #[error("spawning moto_server: {0}")]
    Spawn(std::io::Error),
    #[error("moto_server did not answer on port {0} within 60 s")]
    NoAnswer(u16),
    #[error("spawning the watchdog: {0}")]
    Watchdog(std::io::Error),
}

/// A venv in `dir` with `packages` installed (`python3 -m venv`, then `pip install`), made
/// once: a `.ready` file marks a finished install.
pub fn venv(dir: &Path, packages: &[&str]) -> Result<PathBuf, LocalAwsError> {
    venv_with(Path::new("python3"), dir, packages)
}

/// `venv` made by another interpreter (e.g. a newer Python than the machine's `python3`).
pub fn venv_with(python: &Path, dir: &Path, packages: &[&str]) -> Result<PathBuf, LocalAwsError> {
    let ready = dir.join(".ready");
    if ready.exists() {
        return Ok(dir.to_owned());
    }
    let _ = std::fs::remove_dir_all(dir);
    run(Command::new(python).args(["-m", "venv"]).arg(dir))?;
    run(Command::new(dir.join("bin/pip")).args(["install", "--quiet", "--disable-pip-version-check"]).args(packages))?;
    std::fs::write(&ready, b"").map_err(LocalAwsError::Io)?;
    Ok(dir.to_owned())
}

/// The venv holding moto's server, under `tmp` (the target dir's `tmp` for tests and chaos).
pub fn moto_venv(tmp: &Path) -> Result<PathBuf, LocalAwsError> {
    venv(&tmp.join("moto-venv"), &["moto[server]>=5,<6"])
}

fn run(cmd: &mut Command) -> Result<(), LocalAwsError> {
    let out =
        cmd.stdin(Stdio::null()).output().map_err(|error| LocalAwsError::Run { cmd: format!("{cmd:?}"), error })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LocalAwsError::Failed {
            cmd: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Start `moto_server` from `venv` on a free port, logging to `log_dir/moto-<port>.log`; returns
/// its endpoint and the child once it answers.
pub fn start_moto(venv: &Path, log_dir: &Path) -> Result<(String, Child), LocalAwsError> {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(LocalAwsError::Io)?.port();
    let log = std::fs::File::create(log_dir.join(format!("moto-{port}.log"))).map_err(LocalAwsError::Io)?;
    let mut child = Command::new(venv.join("bin/moto_server"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(LocalAwsError::Io)?)
        .stderr(log)
        .spawn()
        .map_err(LocalAwsError::Spawn)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if answers(port) {
            return Ok((format!("http://127.0.0.1:{port}"), child));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    Err(LocalAwsError::NoAnswer(port))
}

/// moto's endpoint for this process: `RELAY_MOTO_URL` when set, else a `moto_server` from the
/// venv under `tmp` (made on first use), killed when this process exits. Blocks while it starts.
pub fn moto_for_this_process(tmp: &Path) -> Result<String, LocalAwsError> {
    if let Some(url) = std::env::var("RELAY_MOTO_URL").ok().filter(|u| !u.is_empty()) {
        return Ok(url.trim_end_matches('/').to_owned());
    }
    std::fs::create_dir_all(tmp).map_err(LocalAwsError::Io)?;
    let venv = moto_venv(tmp)?;
    let (url, child) = start_moto(&venv, tmp)?;
    kill_when_process_exits(child.id(), std::process::id())?;
    Ok(url)
}

/// An SDK configuration for a local AWS-protocol server at `endpoint` (moto, or a stand-in in
/// front of it): us-east-1 and dummy credentials, nothing read from the environment.
pub fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    use aws_sdk_sqs::config::{Credentials, SharedCredentialsProvider};
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "relay-local",
        )))
        .build()
}

/// Kill process `child` once process `parent` has exited (a detached shell watches it): for
/// test runs, which have no hook at exit.
pub fn kill_when_process_exits(child: u32, parent: u32) -> Result<(), LocalAwsError> {
    crate::watchdog::when_process_exits(parent, &format!("kill {child} 2>/dev/null")).map_err(LocalAwsError::Watchdog)
}

/// Whether moto answers an HTTP request on its management API.
fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = "GET /moto-api/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}
