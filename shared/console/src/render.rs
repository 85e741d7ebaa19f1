//! The console page, rendered on the server from the cache: a view model computed here (ages,
//! liveness, progress bars, chart geometry) and one minijinja template that escapes every
//! value (`page.html`; auto-escape is on for `.html` templates).

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use minijinja::Environment;
use serde::Serialize;

use super::poll::ProjectState;
use relay_status::{Activity, Run, StatusDoc};

/// A worker seen within this long of its project's document counts as live.
pub const LIVE_WITHIN_SECS: i64 = 90;
const CHART_W: f64 = 288.0;
const CHART_H: f64 = 48.0;

#[derive(Debug, Serialize)]
pub struct PageView {
    pub now: String,
    pub refresh_s: u64,
    pub projects: Vec<ProjectView>,
}

#[derive(Debug, Serialize)]
pub struct ProjectView {
    pub name: String,
    pub status_url: String,
    /// `ok`, `unreachable` or `unknown` (not polled yet).
    pub state: &'static str,
    pub unreachable_since: Option<String>,
    pub unreachable_for: Option<String>,
    pub last_error: Option<String>,
    /// Unreachable but showing its last good data (greyed).
    pub stale: bool,
    pub data_from: Option<String>,
    pub data: Option<DataView>,
}

#[derive(Debug, Serialize)]
pub struct DataView {
    pub contract_version: String,
    pub live: usize,
    pub seen: usize,
    pub live_kinds: String,
    pub workers: Vec<WorkerView>,
    pub depth: i64,
    pub oldest_pending: String,
    pub queues: Vec<QueueView>,
    pub failures_hour: i64,
    pub failures_day: i64,
    pub open_exceptions: i64,
    /// Messages kept as dead letters in the last 24 hours, when the project reports them (1.3).
    pub dead_letters: Option<i64>,
    /// The newest open exceptions, when the project reports them (1.2).
    pub exceptions: Vec<ExceptionView>,
    pub schedules: Vec<ScheduleView>,
    pub runs: Vec<RunView>,
    pub chart: Option<ChartView>,
}

#[derive(Debug, Serialize)]
pub struct ExceptionView {
    pub short_id: String,
    pub id: String,
    pub kind: String,
    pub task_type: String,
    pub tenant: String,
    pub cause: String,
    pub opened: String,
}

#[derive(Debug, Serialize)]
pub struct WorkerView {
    pub kind: String,
    pub instance_id: String,
    pub last_seen: String,
    pub live: bool,
}

#[derive(Debug, Serialize)]
pub struct QueueView {
    pub name: String,
    pub transport: String,
    pub depth: i64,
    pub running: Option<i64>,
    pub scheduled: Option<i64>,
    pub oldest: String,
}

#[derive(Debug, Serialize)]
pub struct ScheduleView {
    pub name: String,
    pub last_run: String,
    pub last_outcome: String,
    pub next_run: String,
}

#[derive(Debug, Serialize)]
pub struct RunView {
    pub id: String,
    pub short_id: String,
    pub task_type: String,
    pub tenant: String,
    pub status: String,
    /// 0–100 when the run has a countable progress.
    pub percent: Option<f64>,
    pub progress: String,
    pub when: String,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ChartView {
    pub width: f64,
    pub height: f64,
    pub bars: Vec<BarView>,
    pub runs_total: i64,
    pub failures_total: i64,
    pub window: String,
    pub truncated: bool,
}

#[derive(Debug, Serialize)]
pub struct BarView {
    pub x: f64,
    pub w: f64,
    pub runs_y: f64,
    pub runs_h: f64,
    pub fail_y: f64,
    pub fail_h: f64,
    pub title: String,
}

/// A short age: "12 s", "4 min", "3 h", "2 d".
pub fn ago(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 120.0 {
        format!("{} s", s.round() as i64)
    } else if s < 7200.0 {
        format!("{} min", (s / 60.0).round() as i64)
    } else if s < 172_800.0 {
        format!("{} h", (s / 3600.0).round() as i64)
    } else {
        format!("{} d", (s / 86_400.0).round() as i64)
    }
}

/// The last eight characters of an id (the whole id is in the title).
fn short(id: &str) -> String {
    id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect()
}

fn since(now: DateTime<Utc>, at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "—".into(), |t| format!("{} ago", ago((now - t).num_milliseconds() as f64 / 1000.0)))
}

fn until(now: DateTime<Utc>, at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(|| "—".into(), |t| {
        let s = (t - now).num_milliseconds() as f64 / 1000.0;
        if s >= 0.0 { format!("in {}", ago(s)) } else { format!("{} ago", ago(-s)) }
    })
}

fn clock(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub fn view(states: &[ProjectState], refresh_s: u64, now: DateTime<Utc>) -> PageView {
    let projects = states
        .iter()
        .map(|s| {
            let state = if s.polled_at.is_none() { "unknown" } else if s.reachable() { "ok" } else { "unreachable" };
            ProjectView {
                name: s.name.clone(),
                status_url: s.status_url.clone(),
                state,
                unreachable_since: s.unreachable_since.map(clock),
                unreachable_for: s.unreachable_since.map(|t| ago((now - t).num_milliseconds() as f64 / 1000.0)),
                last_error: s.last_error.clone(),
                stale: state == "unreachable" && s.last_good.is_some(),
                data_from: s.last_good.as_ref().map(|(_, at)| clock(*at)),
                data: s.last_good.as_ref().map(|(doc, at)| data(doc, doc.generated_at.unwrap_or(*at), now)),
            }
        })
        .collect();
    PageView { now: clock(now), refresh_s, projects }
}

fn data(doc: &StatusDoc, at: DateTime<Utc>, now: DateTime<Utc>) -> DataView {
    let workers: Vec<WorkerView> = doc
        .workers
        .iter()
        .map(|w| WorkerView {
            kind: w.kind.clone(),
            instance_id: w.instance_id.clone(),
            last_seen: since(now, w.last_seen_at),
            live: w.last_seen_at.is_some_and(|t| (at - t).num_seconds() <= LIVE_WITHIN_SECS),
        })
        .collect();
    let mut kinds: Vec<&str> = workers.iter().filter(|w| w.live).map(|w| w.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let oldest = doc.queues.iter().map(|q| q.oldest_pending_age_s).fold(0.0, f64::max);
    DataView {
        contract_version: doc.version.clone(),
        live: workers.iter().filter(|w| w.live).count(),
        seen: workers.len(),
        live_kinds: kinds.join(", "),
        workers,
        depth: doc.queues.iter().map(|q| q.depth).sum(),
        oldest_pending: if oldest > 0.0 { ago(oldest) } else { "—".into() },
        queues: doc
            .queues
            .iter()
            .filter(|q| q.depth > 0 || q.running.unwrap_or(0) > 0 || q.scheduled.unwrap_or(0) > 0)
            .map(|q| QueueView {
                name: q.name.clone(),
                transport: q.transport.clone(),
                depth: q.depth,
                running: q.running,
                scheduled: q.scheduled,
                oldest: if q.oldest_pending_age_s > 0.0 { ago(q.oldest_pending_age_s) } else { "—".into() },
            })
            .collect(),
        failures_hour: doc.failures.last_hour,
        failures_day: doc.failures.last_24h,
        open_exceptions: doc.failures.open_exceptions,
        dead_letters: doc.failures.dead_letters_24h,
        exceptions: doc
            .exceptions
            .iter()
            .flatten()
            .map(|e| ExceptionView {
                short_id: short(&e.id),
                id: e.id.clone(),
                kind: e.kind.clone(),
                task_type: e.task_type.clone(),
                tenant: e.tenant.clone().unwrap_or_default(),
                cause: e.cause.clone(),
                opened: since(now, e.opened_at),
            })
            .collect(),
        schedules: doc
            .schedules
            .iter()
            .map(|s| ScheduleView {
                name: s.name.clone(),
                last_run: since(now, s.last_run_at),
                last_outcome: s.last_outcome.clone().unwrap_or_else(|| "—".into()),
                next_run: until(now, s.next_run_at),
            })
            .collect(),
        runs: doc.recent_runs.iter().map(|r| run(r, now)).collect(),
        chart: doc.activity.as_ref().and_then(chart),
    }
}

fn run(r: &Run, now: DateTime<Utc>) -> RunView {
    let (percent, progress) = match &r.progress {
        Some(p) if p.kind == "count" || p.kind == "children" => {
            let (done, total) = (p.done.unwrap_or(0), p.total.unwrap_or(0));
            let pct = p.fraction.unwrap_or(if total > 0 { done as f64 / total as f64 } else { 0.0 });
            let failed = p.failed.filter(|f| *f > 0).map(|f| format!(", {f} failed")).unwrap_or_default();
            (Some((pct * 100.0).clamp(0.0, 100.0)), format!("{done} of {total}{failed}"))
        }
        Some(p) if p.kind == "elapsed" => (None, format!("running {}", ago(p.elapsed_s.unwrap_or(0.0)))),
        _ if r.status == "succeeded" => (Some(100.0), String::new()),
        _ => (None, String::new()),
    };
    let when = match r.finished_at {
        Some(t) => format!("finished {}", since(now, Some(t))),
        None => format!("started {}", since(now, r.started_at.or(r.created_at))),
    };
    RunView {
        short_id: short(&r.id),
        id: r.id.clone(),
        task_type: r.task_type.clone(),
        tenant: r.tenant.clone().unwrap_or_default(),
        status: r.status.clone(),
        percent,
        progress,
        when,
        error: r.last_error.clone().filter(|_| r.status == "failed"),
    }
}

fn chart(a: &Activity) -> Option<ChartView> {
    let n = a.runs.len().max(a.failures.len());
    if n == 0 {
        return None;
    }
    let at = |v: &[i64], i: usize| v.get(i).copied().unwrap_or(0).max(0);
    let max = (0..n).map(|i| at(&a.runs, i).max(at(&a.failures, i))).max().unwrap_or(0).max(1) as f64;
    let w = CHART_W / n as f64;
    let bucket_min = a.bucket_s as f64 / 60.0;
    let bars = (0..n)
        .map(|i| {
            let (runs, fails) = (at(&a.runs, i), at(&a.failures, i));
            let runs_h = (runs as f64 / max * (CHART_H - 2.0)).max(if runs > 0 { 1.0 } else { 0.0 });
            let fail_h = (fails as f64 / max * (CHART_H - 2.0)).max(if fails > 0 { 1.0 } else { 0.0 });
            let start = (n - i) as f64 * bucket_min;
            BarView {
                x: i as f64 * w + 1.0,
                w: (w - 2.0).max(1.0),
                runs_y: CHART_H - runs_h,
                runs_h,
                fail_y: CHART_H - fail_h,
                fail_h,
                title: format!("{start:.0}–{:.0} min ago: {runs} runs, {fails} failures", start - bucket_min),
            }
        })
        .collect();
    Some(ChartView {
        width: CHART_W,
        height: CHART_H,
        bars,
        runs_total: a.runs.iter().sum(),
        failures_total: a.failures.iter().sum(),
        window: ago(a.bucket_s as f64 * n as f64),
        truncated: a.truncated,
    })
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.add_template("page.html", include_str!("page.html")).expect("the console template parses");
        env
    })
}

/// The whole page as HTML.
pub fn page(view: &PageView) -> Result<String, minijinja::Error> {
    env().get_template("page.html")?.render(minijinja::value::Serde(view))
}
