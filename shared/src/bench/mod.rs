//! `relay bench`: Relay's figures beside the physical limit of the same database, in one run.
//! Each measurement runs `runs` times; the table shows medians, the JSON keeps every run.

pub mod probe;
pub mod processing;
pub mod setup;

use std::path::PathBuf;

use serde_json::{Value, json};

pub struct Options {
    pub quick: bool,
    pub runs: usize,
    pub out: PathBuf,
    /// Sections to run; empty means all.
    pub only: Vec<String>,
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

pub async fn run(url: &str, opts: &Options) -> anyhow::Result<()> {
    let mut report = serde_json::Map::new();
    enable_statement_counts(url).await;
    let secs = if opts.quick { 1.0 } else { 3.0 };
    if opts.wants("probe") {
        let mut runs = Vec::new();
        for _ in 0..opts.runs {
            runs.push(probe::run(url, secs).await?);
        }
        let m = |f: fn(&probe::Probe) -> f64| median(runs.iter().map(f).collect());
        println!("physical limit   commits/s 1 client {:>9.0}   16 clients {:>9.0}   100-row insert rows/s {:>9.0}",
            m(|p| p.commits_per_sec_1), m(|p| p.commits_per_sec_16), m(|p| p.multi_insert_rows_per_sec));
        report.insert("probe".into(), json!(runs));
    }
    if opts.wants("processing") {
        let sizes: &[usize] = if opts.quick { &[20_000] } else { &[20_000, 200_000] };
        let mut all = Vec::new();
        for &n in sizes {
            for w in [1, 4, 16] {
                let mut runs = Vec::new();
                for _ in 0..opts.runs {
                    runs.push(processing::run(url, n, w, 256).await?);
                }
                let rate = median(runs.iter().map(|r| r.jobs_per_sec).collect());
                let rss = median(runs.iter().filter_map(|r| r.worker_peak_rss_mib).collect());
                let commits = median(runs.iter().map(|r| r.commits_per_job).collect());
                let stmts = median(runs.iter().filter_map(|r| r.statements_per_job).collect());
                println!("processing       {n:>7} noop  W={w:<2}  {rate:>9.0} jobs/s   worker RSS {rss:>5.1} MiB   {commits:.3} commits/job   {stmts:.3} statements/job");
                all.push(json!({"jobs": n, "workers": w, "median_jobs_per_sec": rate, "runs": runs}));
            }
        }
        report.insert("processing".into(), Value::Array(all));
    }
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.out, serde_json::to_string_pretty(&Value::Object(report))?)?;
    eprintln!("wrote {}", opts.out.display());
    Ok(())
}

/// Statement counts need pg_stat_statements (preloaded in the bench's private cluster); without
/// it the cost figures show commits only.
async fn enable_statement_counts(url: &str) {
    if let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        tokio::spawn(conn);
        let _ = client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await;
    }
}
