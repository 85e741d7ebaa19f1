//! Clean-up for processes Relay starts for tests, benchmarks and local runs (a private Postgres
//! cluster, a moto server), which have no hook at exit: a detached shell waits for the parent
//! process to exit, then runs the clean-up command.

use std::process::{Command, Stdio};

/// Run `command` (a shell command) once process `pid` has exited.
pub fn when_process_exits(pid: u32, command: &str) -> std::io::Result<()> {
    let script = format!("while kill -0 {pid} 2>/dev/null; do sleep 1; done; {command}");
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|_| ())
}
