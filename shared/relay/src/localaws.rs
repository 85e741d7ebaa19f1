//! Python tools from PyPI in venvs of their own, and moto's server mode (the local
//! AWS-protocol server): shared by the test harness and `relay chaos`, so there is one way to
//! install and start them. Nothing here runs in production.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A venv in `dir` with `packages` installed (`python3 -m venv`, then `pip install`), made
/// once: a `.ready` file marks a finished install.
pub fn venv(dir: &Path, packages: &[&str]) -> Result<PathBuf, String> {
    venv_with(Path::new("python3"), dir, packages)
}

/// `venv` made by another interpreter (e.g. a newer Python than the machine's `python3`).
pub fn venv_with(python: &Path, dir: &Path, packages: &[&str]) -> Result<PathBuf, String> {
    let ready = dir.join(".ready");
    if ready.exists() {
        return Ok(dir.to_owned());
    }
    let _ = std::fs::remove_dir_all(dir);
    run(Command::new(python).args(["-m", "venv"]).arg(dir))?;
    run(Command::new(dir.join("bin/pip")).args(["install", "--quiet", "--disable-pip-version-check"]).args(packages))?;
    std::fs::write(&ready, b"").map_err(|e| e.to_string())?;
    Ok(dir.to_owned())
}

/// The venv holding moto's server, under `tmp` (the target dir's `tmp` for tests and chaos).
pub fn moto_venv(tmp: &Path) -> Result<PathBuf, String> {
    venv(&tmp.join("moto-venv"), &["moto[server]>=5,<6"])
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// Start `moto_server` from `venv` on a free port, logging to `log_dir/moto-<port>.log`; returns
/// its endpoint and the child once it answers.
pub fn start_moto(venv: &Path, log_dir: &Path) -> Result<(String, Child), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let log = std::fs::File::create(log_dir.join(format!("moto-{port}.log"))).map_err(|e| e.to_string())?;
    let mut child = Command::new(venv.join("bin/moto_server"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawning moto_server: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if answers(port) {
            return Ok((format!("http://127.0.0.1:{port}"), child));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    Err(format!("moto_server did not answer on port {port} within 60 s"))
}

/// Kill process `child` once process `parent` has exited (a detached shell watches it): for
/// test runs, which have no hook at exit.
pub fn kill_when_process_exits(child: u32, parent: u32) -> Result<(), String> {
    crate::watchdog::when_process_exits(parent, &format!("kill {child} 2>/dev/null"))
        .map_err(|e| format!("spawning the watchdog: {e}"))
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
