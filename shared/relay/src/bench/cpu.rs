//! CPU time by process over one phase of a run. On one machine the database, `relay serve` and
//! the benchmark's own client share the same cores, so a throughput figure reads best beside
//! what each accepted job cost each of them, and beside the rate the cores could give at most
//! at that cost (all of them busy). Linux only (`/proc`); elsewhere the figures are absent.

use serde::Serialize;

/// CPU seconds (user + system) used so far by the database server's processes, by the
/// `relay serve` under test and by this process (the benchmark's client).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTimes {
    postgres: Option<f64>,
    server: Option<f64>,
    client: Option<f64>,
}

/// CPU microseconds per unit of work (an accepted job, a probe's commit) in one phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuPerUnit {
    pub postgres_us: Option<f64>,
    pub server_us: Option<f64>,
    pub client_us: Option<f64>,
    /// Units per second the machine's cores could give at this cost, every core busy.
    pub ceiling_per_sec: Option<f64>,
}

impl CpuTimes {
    /// `postmaster`: from `postmaster_pid`; `server`: the `relay serve` child, if any.
    pub fn read(postmaster: Option<u32>, server: Option<u32>) -> CpuTimes {
        CpuTimes {
            postgres: postmaster.and_then(cluster_secs),
            server: server.and_then(process_secs),
            client: process_secs(std::process::id()),
        }
    }

    /// What each of `units` cost between `before` and `self`.
    pub fn per_unit(self, before: CpuTimes, units: u64) -> CpuPerUnit {
        let n = units.max(1) as f64;
        let us = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| (a - b) * 1e6 / n);
        let postgres_us = us(self.postgres, before.postgres);
        let server_us = us(self.server, before.server);
        let client_us = us(self.client, before.client);
        let total = postgres_us.zip(client_us).map(|(p, c)| p + c + server_us.unwrap_or(0.0));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        CpuPerUnit {
            postgres_us,
            server_us,
            client_us,
            ceiling_per_sec: total.filter(|t| *t > 0.0).map(|t| cores * 1e6 / t),
        }
    }
}

impl CpuPerUnit {
    /// Each figure's median over runs.
    pub fn median(runs: impl IntoIterator<Item = CpuPerUnit>) -> CpuPerUnit {
        let all: Vec<CpuPerUnit> = runs.into_iter().collect();
        let m = |f: fn(&CpuPerUnit) -> Option<f64>| {
            let xs: Vec<f64> = all.iter().filter_map(f).collect();
            (!xs.is_empty()).then(|| super::median(xs))
        };
        CpuPerUnit {
            postgres_us: m(|c| c.postgres_us),
            server_us: m(|c| c.server_us),
            client_us: m(|c| c.client_us),
            ceiling_per_sec: m(|c| c.ceiling_per_sec),
        }
    }

    /// "database / server / client" in whole microseconds; "-" where absent.
    pub fn split(&self) -> String {
        let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.0}"));
        format!("{} / {} / {}", f(self.postgres_us), f(self.server_us), f(self.client_us))
    }
}

/// The pid of the server process behind `db`'s connection, when that server runs on this
/// machine (its backend's parent is a local `postgres`); `None` for a remote database.
pub async fn postmaster_pid(db: &impl taskdeck::store::GenericClient) -> Option<u32> {
    let backend = taskdeck::store::tooling::bench::backend_pid(db).await.ok()?;
    let stat = Stat::read(u32::try_from(backend).ok()?)?;
    let parent = Stat::read(stat.ppid)?;
    (stat.comm == "postgres" && parent.comm == "postgres").then_some(stat.ppid)
}

fn process_secs(pid: u32) -> Option<f64> {
    Stat::read(pid).map(|s| s.cpu_secs)
}

/// The postmaster and every process it started (backends, writers, the WAL writer).
fn cluster_secs(postmaster: u32) -> Option<f64> {
    let own = process_secs(postmaster)?;
    let children: f64 = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(Stat::read)
        .filter(|s| s.ppid == postmaster)
        .map(|s| s.cpu_secs)
        .sum();
    Some(own + children)
}

/// Clock ticks per second in `/proc/<pid>/stat`: the kernel's USER_HZ, 100 on x86_64 and
/// aarch64 whatever the kernel's own tick rate.
const USER_HZ: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` used here.
struct Stat {
    comm: String,
    ppid: u32,
    cpu_secs: f64,
}

impl Stat {
    fn read(pid: u32) -> Option<Stat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ')'.
        let (head, tail) = text.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let fields: Vec<&str> = tail.split_whitespace().collect();
        // After comm: state(0) ppid(1) ... utime(11) stime(12), in clock ticks.
        let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(Stat { comm, ppid: fields.get(1)?.parse().ok()?, cpu_secs: ticks / USER_HZ })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_and_its_cpu_time_grows_with_work() {
        let before = CpuTimes::read(None, None);
        // A fixed amount of work, not a wall-clock spin: on a loaded machine the wall clock
        // says little about the CPU a process got.
        let mut x = 0u64;
        for _ in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let cost = CpuTimes::read(None, None).per_unit(before, 1);
        assert!(cost.client_us.unwrap() > 20_000.0, "{cost:?}");
        assert!(cost.postgres_us.is_none() && cost.server_us.is_none() && cost.ceiling_per_sec.is_none());
    }
}
