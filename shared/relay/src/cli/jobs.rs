//! `relay jobs list|show|watch`: a tenant's jobs read straight from the database
//! (`DATABASE_URL`, or `relay dev`'s), for an operator at a terminal. `watch` draws a live progress bar of a job
//! and its children (the numerator counts children in a terminal state).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use deadpool_postgres::Pool;
use indicatif::{ProgressBar, ProgressStyle};
use taskdeck::job::{JobId, JobStatus, TenantId};
use taskdeck::store::jobs::{self, JobFilter};
use taskdeck::store::{progress, tenants};
use taskdeck::view::JobView;

#[derive(clap::Subcommand)]
pub enum JobsCommand {
    /// The tenant's jobs changed within --since, newest change first.
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        task_type: Option<String>,
        /// How far back, in minutes.
        #[arg(long, default_value_t = 60)]
        since: i64,
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// One job as JSON, its history, and its children's counts.
    Show { id: JobId },
    /// A live progress bar of a job and its children until it is done (Ctrl-C leaves it running).
    Watch {
        id: JobId,
        /// Seconds between reads.
        #[arg(long, default_value_t = 0.5)]
        every: f64,
    },
}

async fn tenant(pool: &Pool, name: &str) -> anyhow::Result<tenants::Tenant> {
    tenants::by_name(&pool.get().await?, name).await?.with_context(|| format!("no tenant named {name:?}"))
}

pub async fn run(pool: &Pool, tenant_name: &str, command: JobsCommand) -> anyhow::Result<()> {
    let t = tenant(pool, tenant_name).await?;
    match command {
        JobsCommand::List { status, task_type, since, limit } => {
            let status = match status.as_deref() {
                None => None,
                Some(s) => Some(JobStatus::parse(s).with_context(|| {
                    format!("--status must be one of {}", JobStatus::ALL.map(JobStatus::as_str).join(", "))
                })?),
            };
            let mut filter = JobFilter {
                status,
                task_type,
                updated_since: Some(Utc::now() - chrono::Duration::minutes(since.max(1))),
                limit: 1000,
                ..JobFilter::default()
            };
            // The change feed runs oldest first: follow it to its end, keep the last `limit`.
            let keep = usize::try_from(limit.clamp(1, 1000)).unwrap_or(100);
            let mut page = std::collections::VecDeque::new();
            let db = pool.get().await?;
            loop {
                let got = jobs::list(&db, t.id, &filter).await?;
                let full = got.len() as i64 == filter.limit;
                filter.after = got.last().map(|j| (j.updated_at, j.id));
                for j in got {
                    if page.len() == keep {
                        page.pop_front();
                    }
                    page.push_back(j);
                }
                if !full {
                    break;
                }
            }
            let page: Vec<_> = page.into_iter().rev().collect();
            println!("{:<36}  {:<18}  {:<9}  {:>7}  {:<20}  correlation", "id", "task", "status", "attempt", "updated");
            for j in &page {
                println!(
                    "{:<36}  {:<18}  {:<9}  {:>7}  {:<20}  {}",
                    j.id,
                    j.task_type,
                    j.status.as_str(),
                    format!("{}/{}", j.attempt, j.max_attempts),
                    j.updated_at.format("%Y-%m-%d %H:%M:%S"),
                    j.correlation_id
                );
            }
            eprintln!("{} jobs", page.len());
            Ok(())
        }
        JobsCommand::Show { id } => {
            let db = pool.get().await?;
            let job =
                jobs::get(&db, t.id, id).await?.with_context(|| format!("no job {id} for tenant {tenant_name:?}"))?;
            let events = jobs::events(&db, t.id, id).await?;
            let children = progress::child_counts(&db, &[id]).await?.remove(&id).unwrap_or_default();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "job": JobView::bare(job),
                    "events": events,
                    "children": { "total": children.total, "terminal": children.terminal(), "succeeded": children.succeeded, "shadowed": children.shadowed, "skipped": children.skipped, "failed": children.failed, "cancelled": children.cancelled },
                }))?
            );
            Ok(())
        }
        JobsCommand::Watch { id, every } => {
            watch(pool, t.id, id, Duration::from_secs_f64(every.clamp(0.1, 60.0))).await
        }
    }
}

/// Draws a bar on a terminal; piped or redirected, prints a line on stdout at each change.
/// Exits non-zero unless the job succeeded.
async fn watch(pool: &Pool, tenant_id: TenantId, id: JobId, every: Duration) -> anyhow::Result<()> {
    let tty = std::io::stderr().is_terminal();
    let bar = if tty { ProgressBar::new(0) } else { ProgressBar::hidden() };
    let mut last_line = String::new();
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar:.cyan/blue} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if tty {
        bar.enable_steady_tick(Duration::from_millis(120));
    }
    loop {
        let (job, children) = {
            let db = pool.get().await?;
            let job = jobs::get(&db, tenant_id, id).await?.with_context(|| format!("no job {id} for this tenant"))?;
            (job, progress::child_counts(&db, &[id]).await?.remove(&id).unwrap_or_default())
        };
        if children.total > 0 {
            bar.set_length(u64::try_from(children.total).unwrap_or(0));
            bar.set_position(u64::try_from(children.terminal()).unwrap_or(0));
        } else {
            bar.set_length(1);
            bar.set_position(u64::from(job.status.is_terminal()));
        }
        let failed = if children.failed > 0 {
            format!(", {} {} failed", children.failed, if children.failed == 1 { "child" } else { "children" })
        } else {
            String::new()
        };
        let message =
            format!("{} {} (attempt {}/{}){failed}", job.task_type, job.status.as_str(), job.attempt, job.max_attempts);
        if !tty {
            let line = if children.total > 0 {
                format!("{}/{} children done: {message}", children.terminal(), children.total)
            } else {
                message.clone()
            };
            if line != last_line {
                println!("{} {line}", Utc::now().format("%H:%M:%S"));
                last_line = line;
            }
        }
        bar.set_message(message);
        if job.status.is_terminal() && children.terminal() == children.total {
            bar.finish();
            if let Some(e) = job.last_error.filter(|_| job.status == JobStatus::Failed) {
                eprintln!("failed: {e}");
            }
            if job.status != JobStatus::Succeeded {
                anyhow::bail!("job {id} {}", job.status.as_str());
            }
            return Ok(());
        }
        tokio::time::sleep(every).await;
    }
}
