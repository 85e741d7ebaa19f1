//! `relay bench`: Relay's figures beside the physical limit of the same database, in one run.
//! Each measurement runs `runs` times; the table shows medians, the JSON keeps every run.
//! Ratios matter more than absolutes here: commit latency on shared disks swings ~20×.

pub mod campaign;
pub mod cpu;
pub mod intake;
pub mod lambda;
pub mod latency;
pub mod pace;
pub mod peer;
pub mod probe;
pub mod processing;
pub mod setup;
pub mod sweep;
pub mod wal;

use std::path::PathBuf;

use serde_json::{Map, Value, json};

/// `relay worker --concurrency` for the processing runs: each loop claims up to this many
/// jobs per statement (bigger claims and completions amortise per-statement cost).
pub const WORKER_CONCURRENCY: usize = 1000;

pub struct Options {
    pub quick: bool,
    pub runs: usize,
    pub out: PathBuf,
    /// Sections to run; empty means all.
    pub only: Vec<String>,
    /// A peer job queue to run beside Relay, alternating (`peer::PEERS`).
    pub peer: Option<String>,
    /// Where the peer is installed (`target/peer`).
    pub peer_dir: PathBuf,
    /// The `pace` section's account rate (N sends a second); the SES stand-in throttles above it.
    pub pace_rate: u32,
}

impl Options {
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() { f64::NAN } else { xs[xs.len() / 2] }
}

fn row(section: &str, figure: &str, value: String, note: String) {
    println!("{}", line(section, figure, &value, &note));
}

fn line(section: &str, figure: &str, value: &str, note: &str) -> String {
    format!("{section:<14} {figure:<40} {value:>12}  {note}")
}

fn opt(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{v:.3}"))
}

pub async fn run(url: &str, opts: &Options) -> anyhow::Result<()> {
    enable_statement_counts(url).await;
    let mut report = Map::new();
    let secs = if opts.quick { 1.0 } else { 3.0 };
    let runs = opts.runs;
    report.insert("runs".into(), json!(runs));
    report.insert("quick".into(), json!(opts.quick));
    report.insert("started_at".into(), json!(chrono::Utc::now()));
    println!("relay bench: {runs} run(s) per figure, medians shown{}", if opts.quick { " (quick)" } else { "" });
    let peer = match &opts.peer {
        Some(name) => Some(peer::Peer::install(name, &opts.peer_dir, url).await?),
        None => None,
    };
    row("section", "figure", "value".into(), "beside / target".into());

    let mut commits16 = f64::NAN;
    let mut probe_runs = Vec::new();
    if opts.wants("probe") || opts.wants("intake") {
        for _ in 0..runs {
            probe_runs.push(probe::run(url, secs).await?);
        }
        let m = |f: fn(&probe::Probe) -> f64| median(probe_runs.iter().map(f).collect());
        commits16 = m(|p| p.commits_per_sec_16);
        row(
            "limit",
            "single-row insert commits/s, 1 client",
            format!("{:.0}", m(|p| p.commits_per_sec_1)),
            "physical limit".into(),
        );
        row("limit", "single-row insert commits/s, 16 clients", format!("{commits16:.0}"), "physical limit".into());
        row(
            "limit",
            "100-row multi-insert rows/s",
            format!("{:.0}", m(|p| p.multi_insert_rows_per_sec)),
            "physical limit".into(),
        );
        report.insert("probe_start".into(), json!(probe_runs));
    }

    if opts.wants("intake") {
        let mut all = Vec::new();
        let mut peer_intake = Vec::new();
        for _ in 0..runs {
            all.push(intake::run(url, secs).await?);
            if let Some(p) = &peer {
                peer_intake.push(p.intake(secs, 20_000).await?);
            }
        }
        for (i, clients) in [1, 16, 64].into_iter().enumerate() {
            let m = |f: fn(&intake::SingleIntake) -> f64| median(all.iter().map(|r| f(&r.single[i])).collect());
            let rate = m(|s| s.accepted_per_sec);
            let note = if clients == 16 {
                format!("{:.0}% of 16-client commits/s (target ≥ 60%)", 100.0 * rate / commits16)
            } else {
                String::new()
            };
            let note = match (&peer, clients) {
                (Some(p), 1) => {
                    let theirs = median(peer_intake.iter().map(|r| r.single_per_sec).collect());
                    format!("{}'s addJob, 1 client (direct SQL): {theirs:.0}/s, ratio {:.2}", p.name, rate / theirs)
                }
                _ => note,
            };
            row("intake", &format!("POST /v1/jobs, {clients} clients: accepted/s"), format!("{rate:.0}"), note);
            row(
                "intake",
                &format!("  latency p50 / p99 ms, {clients} clients"),
                format!("{:.2} / {:.2}", m(|s| s.p50_ms), m(|s| s.p99_ms)),
                String::new(),
            );
            if clients == 16 {
                let job = cpu::CpuPerUnit::median(all.iter().map(|r| r.single[i].cpu_per_job));
                let commit = cpu::CpuPerUnit::median(probe_runs.iter().map(|p| p.cpu_per_commit_16));
                row(
                    "intake",
                    "  CPU µs per job: db / serve / client",
                    job.split(),
                    format!("probe's commit: {}", commit.split()),
                );
                if let (Some(jobs), Some(commits)) = (job.ceiling_per_sec, commit.ceiling_per_sec) {
                    row(
                        "intake",
                        "  at that cost, all cores busy: jobs/s",
                        format!("{jobs:.0}"),
                        format!("{:.0}% of the probe's {commits:.0} commits/s, all cores busy", 100.0 * jobs / commits),
                    );
                }
            }
        }
        let lc = |f: fn(&setup::Lifecycle) -> Option<f64>| opt(all.first().and_then(|r| f(&r.single[1].lifecycle)));
        row(
            "cost",
            "accept: statements per job (16 clients)",
            lc(|l| l.accept),
            "key lookup + insert (its NOTIFY inside)".into(),
        );
        let batch = median(all.iter().map(|r| r.batch_jobs_per_sec).collect());
        row("intake", "POST /v1/jobs:batch (500/request): jobs/s", format!("{batch:.0}"), "target ≥ 40,000".into());
        if let Some(p) = &peer {
            let theirs = median(peer_intake.iter().map(|r| r.bulk_per_sec).collect());
            row(
                "intake",
                &format!("  {}: addJobs (1,000/call, 1 client)", p.name),
                format!("{theirs:.0}"),
                format!("jobs/s over direct SQL; Relay's batch over HTTP is {:.2}× that", batch / theirs),
            );
        }
        let cpu = cpu::CpuPerUnit::median(all.iter().map(|r| r.batch_cpu_per_job));
        row(
            "intake",
            "  CPU µs per job: db / serve / client",
            cpu.split(),
            cpu.ceiling_per_sec.map_or(String::new(), |c| format!("{c:.0} jobs/s at that cost, all cores busy")),
        );
        report.insert("intake".into(), json!(all));
        if !peer_intake.is_empty() {
            report.insert("peer_intake".into(), json!(peer_intake));
        }
    }

    if opts.wants("processing") {
        report.insert("processing".into(), processing::section(url, opts, peer.as_ref()).await?);
    }

    if opts.wants("latency") {
        let mut all = Vec::new();
        for _ in 0..runs {
            all.push(latency::run(url, if opts.quick { 100 } else { 300 }).await?);
        }
        let p50 = median(all.iter().map(|r| r.p50_ms).collect());
        let p99 = median(all.iter().map(|r| r.p99_ms).collect());
        row(
            "latency",
            "accept→start p50 / p99 ms (idle system)",
            format!("{p50:.2} / {p99:.2}"),
            "target ≤ 3 / ≤ 20".into(),
        );
        if let Some(l) = all.first().map(|r| r.lifecycle) {
            row(
                "cost",
                "one-at-a-time: accept / claim / complete",
                format!("{} / {} / {}", opt(l.accept), opt(l.claim), opt(l.complete)),
                format!("statements per job; {:.2} commits/job", l.commits_per_job),
            );
        }
        report.insert("latency".into(), json!(all));
    }

    if opts.wants("sweep") {
        let big = if opts.quick { 100_000 } else { 1_000_000 };
        let mut small_runs = Vec::new();
        let mut big_runs = Vec::new();
        for _ in 0..runs {
            small_runs.push(sweep::run(url, 10_000, 10_000).await?);
            big_runs.push(sweep::run(url, big, 10_000).await?);
        }
        let small = median(small_runs.iter().map(|r| r.pass_ms).collect());
        let large = median(big_runs.iter().map(|r| r.pass_ms).collect());
        row("sweep", "pass, 10k due + 10k terminal rows: ms", format!("{small:.0}"), String::new());
        row(
            "sweep",
            &format!("pass, 10k due + {big} terminal rows: ms"),
            format!("{large:.0}"),
            format!("{:.2}× the small table (target ≤ 1.2×)", large / small),
        );
        report.insert("sweep".into(), json!({"small": small_runs, "large": big_runs}));
    }

    if opts.wants("campaign") {
        // One run each (the campaign alone takes minutes while the keyed claim is slow).
        let (pages, per_page, keyed_jobs) = if opts.quick { (2, 1_000, 5_000) } else { (20, 5_000, 100_000) };
        let c = campaign::campaign(url, pages, per_page).await?;
        let rate = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.0}"));
        let flat = |d: &campaign::Drain| d.flatness().map_or("n/a".to_string(), |f| format!("{f:.2}×"));
        row(
            "campaign",
            &format!("{} recipients, shadow, {pages} pages: s", pages * per_page),
            format!("{:.1}", c.seconds),
            format!("end to end{}; target ≤ 60 s at 100,000", if c.finished { "" } else { ", NOT FINISHED" }),
        );
        row(
            "campaign",
            "  children/s at 90% / 10% left",
            format!("{} / {}", rate(c.rate_at_90), rate(c.rate_at_10)),
            format!("ratio {} (target within 1.5×)", flat(&c)),
        );
        let k = campaign::keyed(url, keyed_jobs).await?;
        row(
            "keyed",
            &format!("{keyed_jobs} noop behind one key (limit 10): s"),
            format!("{:.1}", k.seconds),
            if k.finished { String::new() } else { "NOT FINISHED".into() },
        );
        row(
            "keyed",
            "  jobs/s at 90% / 10% left",
            format!("{} / {}", rate(k.rate_at_90), rate(k.rate_at_10)),
            format!("ratio {} (target within 1.5×)", flat(&k)),
        );
        report.insert("campaign".into(), json!({"campaign": c, "keyed": k}));
    }

    if opts.wants("pace") {
        report.insert("pace".into(), pace_section(url, opts).await?);
    }

    if opts.wants("lambda") {
        let n = if opts.quick { 5_000 } else { 20_000 };
        let mut all = Vec::new();
        for containers in [1, 10] {
            let mut rs = Vec::new();
            for _ in 0..runs {
                rs.push(lambda::run(url, n, containers).await?);
            }
            let rate = median(rs.iter().map(|r| r.jobs_per_sec).collect());
            let floor_rate = median(rs.iter().map(|r| r.floor_jobs_per_sec).collect());
            let cost = |f: fn(&lambda::Cost) -> f64| median(rs.iter().map(|r| f(&r.cost)).collect());
            let floor = |f: fn(&lambda::Cost) -> f64| median(rs.iter().map(|r| f(&r.floor)).collect());
            row(
                "lambda",
                &format!("executor handler, SQS batches of 10, {containers} containers"),
                format!("{rate:.0}"),
                format!("jobs/s, one connection per container (floor, no database: {floor_rate:.0})"),
            );
            row(
                "lambda",
                "  commits / SQS requests / invocations per job",
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    cost(|c| c.commits_per_job),
                    cost(|c| c.sqs_requests_per_job),
                    cost(|c| c.invocations_per_job)
                ),
                format!(
                    "floor 0 / {:.2} / {:.2} (send, receive, delete in 10s)",
                    floor(|c| c.sqs_requests_per_job),
                    floor(|c| c.invocations_per_job)
                ),
            );
            row(
                "lambda",
                "  Lambda GB-s per job; WAL bulk accept / run B per job",
                format!(
                    "{:.6}; {:.0} / {:.0}",
                    cost(|c| c.gb_seconds_per_job),
                    cost(|c| c.wal_accept_per_job),
                    cost(|c| c.wal_run_per_job)
                ),
                format!("floor {:.6} GB-s at 128 MB, no WAL; Relay at 256 MB", floor(|c| c.gb_seconds_per_job)),
            );
            let (usd, floor_usd) = (cost(|c| c.usd_per_million), floor(|c| c.usd_per_million));
            row(
                "lambda",
                "  USD per million jobs (Lambda + SQS)",
                format!("{usd:.3}"),
                format!(
                    "floor {floor_usd:.3} ({:.2}×); us-east-1 arm64 list prices, no free tier, RDS not included",
                    usd / floor_usd
                ),
            );
            all.push(json!({"containers": containers, "median_jobs_per_sec": rate, "runs": rs}));
        }
        report.insert("lambda".into(), Value::Array(all));
    }

    if !probe_runs.is_empty() {
        // A second probe shows how far the disk drifted while the bench ran.
        let end = probe::run(url, secs).await?;
        row(
            "limit",
            "commits/s at the end, 1 / 16 clients",
            format!("{:.0} / {:.0}", end.commits_per_sec_1, end.commits_per_sec_16),
            "drift check".into(),
        );
        report.insert("probe_end".into(), json!(end));
    }
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.out, serde_json::to_string_pretty(&Value::Object(report))?)?;
    eprintln!("wrote {}", opts.out.display());
    Ok(())
}

/// The `pace` rows: medians of the runs, and the worst run where the target is "never".
async fn pace_section(url: &str, opts: &Options) -> anyhow::Result<Value> {
    let n = opts.pace_rate;
    let mut all = Vec::new();
    for _ in 0..opts.runs {
        all.push(pace::run(url, n, opts.quick).await?);
    }
    let rate = f64::from(n);
    let m = |f: fn(&pace::PaceRun) -> f64| median(all.iter().map(f).collect());
    let each = |f: fn(&pace::PaceRun) -> f64| all.iter().map(|r| format!("{:.2}", f(r))).collect::<Vec<_>>().join(", ");
    let worst = |f: fn(&pace::PaceRun) -> usize| all.iter().map(f).max().unwrap_or_default();
    let shortest = |f: fn(&pace::PaceRun) -> Option<f64>| all.iter().filter_map(f).min_by(f64::total_cmp);
    let sends = all.first().map_or(0, |r| r.one.sends);
    row(
        "pace",
        "account rate N (stand-in throttles above)",
        format!("{n}/s"),
        format!(
            "paced at HEADROOM {} of it; campaigns' limit {}",
            taskdeck::email::pace::HEADROOM,
            pace::CAMPAIGN_LIMIT
        ),
    );
    let achieved = m(|r| r.one.achieved_per_sec);
    row(
        "pace",
        &format!("one campaign of {sends}: achieved sends/s"),
        format!("{achieved:.2}"),
        format!(
            "{:.1}% of N, first to last send (target within 5 %, never above); runs {}",
            100.0 * achieved / rate,
            each(|r| r.one.achieved_per_sec)
        ),
    );
    row(
        "pace",
        "  sends/s, submission to last send",
        format!("{:.2}", m(|r| r.one.end_to_end_per_sec)),
        format!("{:.1}% of N, start-up included", 100.0 * m(|r| r.one.end_to_end_per_sec) / rate),
    );
    row(
        "pace",
        "  busiest 1-second window (worst run)",
        format!("{}", worst(|r| r.one.busiest_second)),
        format!("target ≤ {n}"),
    );
    row(
        "pace",
        &format!("  shortest span of {} sends, ms (min)", n + 1),
        opt(shortest(|r| r.one.shortest_span_ms)),
        "≥ 1000 keeps every second ≤ N; 1000/HEADROOM when on time".into(),
    );
    row(
        "pace",
        "  throttles (all runs)",
        format!("{}", all.iter().map(|r| r.one.throttled).sum::<u64>()),
        "target 0".into(),
    );
    let shares = |i: usize| median(all.iter().map(|r| r.shared.shares[i] * 100.0).collect());
    row(
        "pace",
        "two tenants' campaigns + single sends: /s",
        format!("{:.2}", m(|r| r.shared.rate_while_both)),
        format!("while both campaigns ran ({:.0} s)", m(|r| r.shared.both_ran_seconds)),
    );
    row(
        "pace",
        "  share: acme / globex / single sends %",
        format!("{:.0} / {:.0} / {:.0}", shares(0), shares(1), shares(2)),
        format!("single sends offered at {:.1}/s", 1.0 / pace::SINGLE_EVERY.as_secs_f64()),
    );
    row(
        "pace",
        "  single sends' wait p50 / p99 ms",
        format!("{:.0} / {:.0}", m(|r| r.shared.single_wait_p50_ms), m(|r| r.shared.single_wait_p99_ms)),
        format!(
            "submission to SES; worst {:.0} ms (bounded: tests/pace.rs asserts < 3 s)",
            all.iter().map(|r| r.shared.single_wait_max_ms).fold(f64::NAN, f64::max)
        ),
    );
    row(
        "pace",
        "  busiest 1-second window (worst run)",
        format!("{}", worst(|r| r.shared.busiest_second)),
        format!("target ≤ {n}; shortest span of {} sends {} ms", n + 1, opt(shortest(|r| r.shared.shortest_span_ms))),
    );
    row(
        "pace",
        "  throttles (all runs)",
        format!("{}", all.iter().map(|r| r.shared.throttled).sum::<u64>()),
        "target 0".into(),
    );
    Ok(json!(all))
}

/// Statement counts need pg_stat_statements (preloaded in the bench's private cluster); without
/// it the cost figures show commits only.
async fn enable_statement_counts(url: &str) {
    if let Ok(client) = setup::admin(url).await {
        taskdeck::store::tooling::bench::enable_statement_counts(&client).await;
    }
}
