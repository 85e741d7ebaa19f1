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
const CHART_W: f64 = 320.0;
const CHART_H: f64 = 72.0;
/// Room for the y axis's labels, and for the x axis's below the plot.
const AXIS_LEFT: f64 = 32.0;
const AXIS_BELOW: f64 = 14.0;

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
    /// Jobs waiting for an outside party's completion, and those past their deadline, when
    /// the project reports them (1.4).
    pub completions: Option<relay_status::Completions>,
    /// The newest open exceptions, when the project reports them (1.2).
    pub exceptions: Vec<ExceptionView>,
    /// Tenants' HTTP destinations, when the project reports them (1.4).
    pub destinations: Vec<DestinationView>,
    /// The rates email is sent at, when the project reports them (1.5).
    pub send_rates: Vec<SendRateView>,
    /// Tenants' and configuration sets' sending reputation, when reported (1.6).
    pub reputation: Vec<ReputationView>,
    /// Email cut-over stages, when reported (1.6).
    pub cutovers: Vec<CutoverView>,
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
pub struct DestinationView {
    pub tenant: String,
    pub name: String,
    pub writes: &'static str,
    pub rate: String,
    pub last_outcome: String,
    pub last_call: String,
}

/// A send rate: what holds now and why (an operator's setting, SES's, a throttle back-off).
#[derive(Debug, Serialize)]
pub struct SendRateView {
    pub scope: String,
    pub key: String,
    pub effective: String,
    pub source: String,
    /// Below its base because of throttles.
    pub backed_off: bool,
    pub throttles: i64,
    pub last_throttle: String,
    pub quota: String,
}

/// A tenant's (or configuration set's) reputation: its guard's state and rolling rates.
#[derive(Debug, Serialize)]
pub struct ReputationView {
    pub scope: String,
    pub key: String,
    /// ok, warning, paused; — for a configuration set.
    pub state: String,
    /// warning or paused: shown as such.
    pub alarm: bool,
    pub bounces: String,
    pub complaints: String,
    pub sends: String,
    pub why: String,
}

/// A cut-over stage; `halted` when it went back to shadow by itself, saying why.
#[derive(Debug, Serialize)]
pub struct CutoverView {
    pub tenant: String,
    pub task_type: String,
    pub stage: String,
    pub halted: bool,
    pub note: String,
}

#[derive(Debug, Serialize)]
pub struct WorkerView {
    pub kind: String,
    pub instance_id: String,
    pub last_seen: String,
    pub live: bool,
    /// Not live, and a live instance of its kind started after it was last seen: an earlier
    /// start, not a missing worker (left out of the liveness count).
    pub replaced: bool,
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
    /// How it ended, for its colour: `ok` (succeeded, every child too), `partial` (succeeded
    /// by a 1.x document while children failed), `failed`, `cancelled`; `live` while it runs.
    pub outcome: &'static str,
    /// 0–100 when the run has a countable progress: the share of children ended well, and
    /// of children that failed (drawn red beside it).
    pub percent: Option<f64>,
    pub failed_percent: Option<f64>,
    /// Children that failed, when any.
    pub failed_children: Option<i64>,
    /// Running past its task type's usual time (`progress.stuck`).
    pub stuck: bool,
    pub progress: String,
    pub when: String,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ChartView {
    pub width: f64,
    pub height: f64,
    /// The plot's left edge (the y axis; its labels to the left) and its floor.
    pub left: f64,
    pub floor: f64,
    /// The one scale both series share: its top value.
    pub y_max: i64,
    pub bars: Vec<BarView>,
    pub runs_total: i64,
    pub failures_total: i64,
    pub window: String,
    /// One bucket's span ("5 min").
    pub bucket: String,
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

/// When a schedule runs next: "in 4 min", or "due now" once its time has come (a slot the
/// sweep has not fired yet is due, not in the past).
fn until(now: DateTime<Utc>, at: Option<DateTime<Utc>>) -> String {
    at.map_or_else(
        || "—".into(),
        |t| {
            let s = (t - now).num_milliseconds() as f64 / 1000.0;
            if s >= 0.5 { format!("in {}", ago(s)) } else { "due now".into() }
        },
    )
}

/// The age of the oldest due job: "—" only when none is due.
fn oldest(depth: i64, age_s: f64) -> String {
    match (depth, age_s) {
        (0, _) => "—".into(),
        (_, a) if a < 1.0 => "< 1 s".into(),
        (_, a) => ago(a),
    }
}

fn clock(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

pub fn view(states: &[ProjectState], refresh_s: u64, now: DateTime<Utc>) -> PageView {
    let projects = states
        .iter()
        .map(|s| {
            let state = if s.polled_at.is_none() {
                "unknown"
            } else if s.reachable() {
                "ok"
            } else {
                "unreachable"
            };
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
    let is_live = |w: &relay_status::Worker| w.last_seen_at.is_some_and(|t| (at - t).num_seconds() <= LIVE_WITHIN_SECS);
    let workers: Vec<WorkerView> = doc
        .workers
        .iter()
        .map(|w| {
            let live = is_live(w);
            let replaced = !live
                && doc.workers.iter().any(|o| {
                    o.kind == w.kind
                        && is_live(o)
                        && matches!((o.started_at, w.last_seen_at), (Some(s), Some(l)) if s >= l)
                });
            WorkerView {
                kind: w.kind.clone(),
                instance_id: w.instance_id.clone(),
                last_seen: since(now, w.last_seen_at),
                live,
                replaced,
            }
        })
        .collect();
    let mut kinds: Vec<&str> = workers.iter().filter(|w| w.live).map(|w| w.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let oldest_age = doc.queues.iter().map(|q| q.oldest_pending_age_s).fold(0.0, f64::max);
    DataView {
        contract_version: doc.version.clone(),
        live: workers.iter().filter(|w| w.live).count(),
        seen: workers.iter().filter(|w| !w.replaced).count(),
        live_kinds: kinds.join(", "),
        workers,
        depth: doc.queues.iter().map(|q| q.depth).sum(),
        oldest_pending: oldest(doc.queues.iter().map(|q| q.depth).sum(), oldest_age),
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
                oldest: oldest(q.depth, q.oldest_pending_age_s),
            })
            .collect(),
        failures_hour: doc.failures.last_hour,
        failures_day: doc.failures.last_24h,
        open_exceptions: doc.failures.open_exceptions,
        dead_letters: doc.failures.dead_letters_24h,
        completions: doc.completions.clone(),
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
        destinations: doc
            .destinations
            .iter()
            .flatten()
            .map(|d| DestinationView {
                tenant: d.tenant.clone().unwrap_or_default(),
                name: d.name.clone(),
                writes: if d.writes_enabled { "on" } else { "off" },
                rate: d.rate_per_second.to_string(),
                last_outcome: match (&d.last_outcome, d.last_http_status) {
                    (Some(o), Some(s)) => format!("{o} ({s})"),
                    (Some(o), None) => o.clone(),
                    (None, _) => "—".into(),
                },
                last_call: since(now, d.last_call_at),
            })
            .collect(),
        send_rates: doc.send_rates.iter().flatten().map(|r| send_rate(r, now)).collect(),
        reputation: doc.reputation.iter().flatten().map(reputation).collect(),
        cutovers: doc.cutovers.iter().flatten().map(|c| cutover(c, now)).collect(),
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

fn send_rate(r: &relay_status::SendRateStatus, now: DateTime<Utc>) -> SendRateView {
    let per_second = |x: f64| ((x * 100.0).round() / 100.0).to_string();
    let source = match (r.configured_rate, r.provider_rate) {
        (Some(c), _) => format!("operator: {}", per_second(c)),
        (None, Some(p)) => format!("SES: {}", per_second(p)),
        (None, None) => "—".into(),
    };
    SendRateView {
        scope: r.scope.clone(),
        key: r.key.clone(),
        effective: r.effective_rate.map_or_else(|| "no limit".into(), per_second),
        source: if r.factor < 1.0 { format!("{source} × {:.2}", r.factor) } else { source },
        backed_off: r.factor < 1.0,
        throttles: r.throttles,
        last_throttle: since(now, r.last_throttle_at),
        quota: match (r.quota_left, r.max_24h) {
            (Some(left), Some(max)) if max >= 0.0 => format!("{left:.0} of {max:.0} left"),
            _ => "—".into(),
        },
    }
}

fn reputation(r: &relay_status::ReputationStatus) -> ReputationView {
    let state = r.state.clone().unwrap_or_else(|| "—".into());
    ReputationView {
        scope: r.scope.clone(),
        key: r.key.clone(),
        alarm: state == "warning" || state == "paused",
        state,
        bounces: format!("{} ({:.2} %)", r.permanent_bounces, r.bounce_rate * 100.0),
        complaints: format!("{} ({:.3} %)", r.complaints, r.complaint_rate * 100.0),
        sends: format!("{} in {} h{}", r.sends, r.window_hours, if r.judged { "" } else { ", too few to judge" }),
        why: r.state_reason.clone().unwrap_or_default(),
    }
}

fn cutover(c: &relay_status::CutoverStatus, now: DateTime<Utc>) -> CutoverView {
    let stage = match c.stage.as_str() {
        "share" => format!("share: {:.1} % of recipients live", c.share * 100.0),
        other => other.to_owned(),
    };
    let note = match (&c.halted_reason, c.halted_at) {
        (Some(why), at) => format!("halted back to shadow {}: {why}", since(now, at)),
        (None, _) => format!("since {}", since(now, c.started_at)),
    };
    CutoverView {
        tenant: c.tenant.clone(),
        task_type: c.task_type.clone(),
        stage,
        halted: c.halted_reason.is_some(),
        note,
    }
}

fn run(r: &Run, now: DateTime<Utc>) -> RunView {
    let failed_children = r.progress.as_ref().and_then(|p| p.failed).filter(|f| *f > 0);
    let mut failed_percent = None;
    let (percent, progress) = match &r.progress {
        Some(p) if p.kind == "count" || p.kind == "children" => {
            let (done, total) = (p.done.unwrap_or(0), p.total.unwrap_or(0));
            let pct = p.fraction.unwrap_or(if total > 0 { done as f64 / total as f64 } else { 0.0 });
            let failed = failed_children.unwrap_or(0);
            // The bar: children that ended well, then those that failed (red), of the total.
            let bad = if total > 0 { failed as f64 / total as f64 } else { 0.0 };
            failed_percent = failed_children.map(|_| (bad * 100.0).clamp(0.0, 100.0));
            // Apart, so a shadowed campaign never reads as sent (1.6; older documents lack them).
            let apart: String =
                [("sent", p.shadowed.and(p.succeeded)), ("shadowed", p.shadowed), ("skipped", p.skipped)]
                    .into_iter()
                    .filter_map(|(what, n)| n.filter(|n| *n > 0).map(|n| format!(", {n} {what}")))
                    .collect();
            let failed_text = failed_children.map(|f| format!(", {f} failed")).unwrap_or_default();
            (Some(((pct - bad) * 100.0).clamp(0.0, 100.0)), format!("{done} of {total}{apart}{failed_text}"))
        }
        Some(p) if p.kind == "elapsed" => {
            let stuck = if p.stuck == Some(true) {
                p.baseline_p95_s
                    .map_or_else(|| " — stuck".to_owned(), |b| format!(" — stuck (usually under {})", ago(b)))
            } else {
                String::new()
            };
            (None, format!("running {}{stuck}", ago(p.elapsed_s.unwrap_or(0.0))))
        }
        _ if r.status == "succeeded" => (Some(100.0), String::new()),
        _ => (None, String::new()),
    };
    let outcome = match r.status.as_str() {
        "succeeded" if failed_children.is_some() => "partial",
        "succeeded" => "ok",
        "failed" => "failed",
        "cancelled" => "cancelled",
        _ => "live",
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
        outcome,
        percent,
        failed_percent,
        failed_children,
        stuck: r.progress.as_ref().is_some_and(|p| p.stuck == Some(true)),
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
    // One scale for both series (runs and failures are counted on the same basis).
    let y_max = (0..n).map(|i| at(&a.runs, i).max(at(&a.failures, i))).max().unwrap_or(0).max(1);
    let max = y_max as f64;
    let plot_h = CHART_H - AXIS_BELOW;
    let w = (CHART_W - AXIS_LEFT) / n as f64;
    let bucket_min = a.bucket_s as f64 / 60.0;
    let bars = (0..n)
        .map(|i| {
            let (runs, fails) = (at(&a.runs, i), at(&a.failures, i));
            let runs_h = (runs as f64 / max * (plot_h - 2.0)).max(if runs > 0 { 1.0 } else { 0.0 });
            let fail_h = (fails as f64 / max * (plot_h - 2.0)).max(if fails > 0 { 1.0 } else { 0.0 });
            let start = (n - i) as f64 * bucket_min;
            BarView {
                x: AXIS_LEFT + i as f64 * w + 1.0,
                w: (w - 2.0).max(1.0),
                runs_y: plot_h - runs_h,
                runs_h,
                fail_y: plot_h - fail_h,
                fail_h,
                title: format!("{start:.0}–{:.0} min ago: {runs} runs, {fails} failures", start - bucket_min),
            }
        })
        .collect();
    Some(ChartView {
        width: CHART_W,
        height: CHART_H,
        left: AXIS_LEFT,
        floor: plot_h,
        y_max,
        bars,
        runs_total: a.runs.iter().sum(),
        failures_total: a.failures.iter().sum(),
        window: ago(a.bucket_s as f64 * n as f64),
        bucket: ago(a.bucket_s as f64),
        truncated: a.truncated,
    })
}

fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.add_filter("count", count);
        env.add_template("page.html", include_str!("page.html")).expect("the console template parses");
        env
    })
}

/// `{{ n|count("child", "children") }}`: "1 child", "2 children", "0 children".
fn count(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The whole page as HTML.
pub fn page(view: &PageView) -> Result<String, minijinja::Error> {
    env().get_template("page.html")?.render(minijinja::value::Serde(view))
}
