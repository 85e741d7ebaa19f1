//! Scenario: outside parties' completions that arrive twice, late, or never. Jobs of
//! `test.await` wait for a completion (their tokens read from the effects ledger, as the party
//! would receive them); a quarter are completed with 2–4 identical copies at once (through
//! the API and through ingress, mixed), a quarter once, a quarter after their deadline (policy
//! `fail`), and a quarter never (policy `retry`: the sweep must find them within one interval
//! and start attempt 2). Broken if any job ends twice, a copy changes anything, a late
//! completion applies, an overdue one is not counted as the tenant's fault (or opens an operator
//! exception), or the sweep misses a deadline.

use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::sqs::SqsEvent;
use serde_json::json;

use super::harness;
use super::{Env, Report};
use taskdeck::job::JobId;
use taskdeck::lambda::ingress::Ingress;
use taskdeck::platform::Settings;
use taskdeck::store::effects;

const SWEEP_MS: u64 = 500;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Fate {
    Twice,
    Once,
    Late,
    Never,
}

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("completions", env.scale);
    let n = env.n(400, 20) / 4 * 4;
    let settings = Settings { sweep_interval: Duration::from_millis(SWEEP_MS), ..Settings::default() };
    let scratch = env.scratch(settings).await?;
    let (pool, platform) = (scratch.platform.pool.clone(), scratch.platform.clone());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut handles = platform.spawn_workers(2, &stop);
    handles.push(platform.spawn_sweeper(&stop));
    // The API as its own process (`relay serve`); workers, sweep and ingress here.
    let (_server, http) = harness::serve(&env.relay, &scratch.url, &[], &env.log("completions-serve")).await?;
    let fates: Vec<Fate> = (0..n).map(|i| [Fate::Twice, Fate::Once, Fate::Late, Fate::Never][i % 4]).collect();
    let mut ids = Vec::new();
    for (i, fate) in fates.iter().enumerate() {
        let params = match fate {
            Fate::Twice | Fate::Once => json!({"within_seconds": 300}),
            Fate::Late => json!({"within_seconds": 3, "on_overdue": "fail"}),
            Fate::Never => json!({"within_seconds": 3, "on_overdue": "retry", "wait_attempts": 1}),
        };
        let body = json!({"task_type": "test.await", "params": params, "max_attempts": 3});
        let (status, job) =
            http.call("POST", "/v1/jobs", Some(&scratch.key), Some(&format!("cmp-{i}")), Some(&body)).await?;
        anyhow::ensure!(status == 202, "submit answered {status}: {job}");
        ids.push(job["id"].as_str().unwrap_or_default().parse::<JobId>()?);
    }
    // The tokens, as the outside party receives them.
    let mut tokens = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    for id in &ids {
        loop {
            let notes = effects::notes(&pool.get().await?, *id).await?;
            if let Some((_, token)) = notes.into_iter().find(|n| n.0 == 1) {
                tokens.push(token);
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < until, "job {id} never opened a wait");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let ingress = Arc::new(Ingress::new(&platform, "platform"));
    // Every copy of every on-time completion at once; late ones after their deadline passed.
    let mut sends = tokio::task::JoinSet::new();
    let mut copies_sent = 0;
    for (i, ((id, token), fate)) in ids.iter().zip(&tokens).zip(&fates).enumerate() {
        let copies = match fate {
            Fate::Twice => 2 + i % 3,
            Fate::Once | Fate::Late => 1,
            Fate::Never => 0,
        };
        for copy in 0..copies {
            copies_sent += usize::from(*fate == Fate::Twice);
            let completion = json!({"token": token, "outcome": "success", "result": {"job": i}});
            let (http, key, ingress, id, fate) = (http.clone(), scratch.key.clone(), ingress.clone(), *id, *fate);
            sends.spawn(async move {
                if fate == Fate::Late {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                if copy % 2 == 1 {
                    let record = json!({"messageId": format!("cmp-{id}-{copy}"), "eventSource": "aws:sqs",
                        "eventSourceARN": "arn:aws:sqs:local:000000000000:relay-ingress",
                        "body": json!({"relay_completion": completion}).to_string()});
                    let event: SqsEvent = serde_json::from_value(json!({"Records": [record]}))?;
                    let failed = ingress.handle(event).await.batch_item_failures.len();
                    return anyhow::Ok((fate, if failed == 0 { "ingress" } else { "ingress_failed" }.to_owned()));
                }
                let (status, body) =
                    http.call("POST", &format!("/v1/jobs/{id}/complete"), Some(&key), None, Some(&completion)).await?;
                let said = match (status, body["applied"].as_bool()) {
                    (200, Some(true)) => "applied".to_owned(),
                    (200, Some(false)) => "replayed".to_owned(),
                    _ => body["error"]["code"].as_str().unwrap_or("?").to_owned(),
                };
                Ok((fate, said))
            });
        }
    }
    let mut answers: Vec<(Fate, String)> = Vec::new();
    while let Some(a) = sends.join_next().await {
        answers.push(a??);
    }
    let all_done = harness::wait_until(Duration::from_secs(60), || harness::all_terminal(&pool)).await;
    let _ = stop_tx.send(true);
    for h in handles {
        let _ = h.await;
    }
    let db = pool.get().await?;
    let row = |sql: &'static str| {
        let db = &db;
        async move { anyhow::Ok(db.query_one(sql, &[]).await?.get::<_, i64>(0)) }
    };
    let ended_twice = row("SELECT count(*) FROM (SELECT job_id FROM job_events e JOIN jobs j ON j.id = e.job_id
        WHERE j.task_type = 'test.await' AND e.kind IN ('succeeded', 'failed') GROUP BY e.job_id, e.attempt HAVING count(*) > 1) d").await?;
    let applied_waits = row("SELECT count(*) FROM completion_waits WHERE closed_by = 'completion'").await?;
    let overdue_waits = row("SELECT count(*) FROM completion_waits WHERE closed_by = 'overdue'").await?;
    let late_ms = row("SELECT coalesce(max(extract(epoch FROM closed_at - deadline) * 1000), 0)::bigint
        FROM completion_waits WHERE closed_by = 'overdue'")
    .await?;
    // An overdue completion is the tenant's (its outside party never answered): counted as its
    // fault, no operator exception.
    let exceptions = row("SELECT count(*) FROM exceptions WHERE kind = 'completion_overdue'").await?;
    let overdue_faults =
        row("SELECT coalesce(sum(count), 0)::int8 FROM tenant_faults WHERE kind = 'completion_overdue'").await?;
    let retried =
        row("SELECT count(*) FROM jobs WHERE task_type = 'test.await' AND status = 'succeeded' AND attempt = 2")
            .await?;
    let wrong_results =
        row("SELECT count(*) FROM jobs WHERE task_type = 'test.await' AND status = 'succeeded' AND attempt = 1
        AND result->'job' IS NULL")
        .await?;
    let replays_kept =
        row("SELECT count(*) FROM jobs WHERE task_type = 'provider.event' AND result->>'completion' = 'replayed'")
            .await?;
    let count = |fate: Fate, said: &str| answers.iter().filter(|(f, s)| *f == fate && s == said).count();
    let quarter = (n / 4) as i64;
    let twice_applied = count(Fate::Twice, "applied") as i64;
    let twice_via_ingress = count(Fate::Twice, "ingress");
    report.fig("jobs (a quarter each: twice, once, late, never)", n);
    report.fig("completion copies sent for the 'twice' jobs", copies_sent);
    report.fig("  of which through ingress", twice_via_ingress);
    report
        .fig("  answered applied / replayed (API)", format!("{} / {}", twice_applied, count(Fate::Twice, "replayed")));
    report.fig("  replays kept by ingress jobs", replays_kept);
    report.fig("late completions refused as overdue", count(Fate::Late, "completion_overdue"));
    report.fig("deadlines passed with no completion (swept)", overdue_waits);
    report.fig("most ms from a deadline to the sweep (interval 500)", late_ms);
    report.fig("completion_overdue tenant faults / operator exceptions", format!("{overdue_faults} / {exceptions}"));
    report.fig("never-completed jobs that succeeded on attempt 2", retried);
    report.fig("jobs that ended an attempt twice", ended_twice);
    report.check(all_done, "not every job finished");
    report.check(copies_sent > n / 4, "no duplicate copies were sent");
    report.check(ended_twice == 0, format!("{ended_twice} job attempts ended twice"));
    report.check(applied_waits == 2 * quarter, format!("{applied_waits} waits completed, expected {}", 2 * quarter));
    report.check(count(Fate::Once, "applied") as i64 == quarter, "a single on-time completion did not apply");
    report.check(
        count(Fate::Late, "completion_overdue") as i64 == quarter,
        "a late completion was not refused as overdue",
    );
    report.check(overdue_waits == 2 * quarter, format!("{overdue_waits} waits swept, expected {}", 2 * quarter));
    report.check(exceptions == 0, format!("{exceptions} completion_overdue exceptions, expected none"));
    report.check(
        overdue_faults == quarter,
        format!("{overdue_faults} completion_overdue tenant faults, expected {quarter}"),
    );
    report.check(retried == quarter, format!("{retried} never-completed jobs retried to success, expected {quarter}"));
    report.check(wrong_results == 0, format!("{wrong_results} completed jobs lack their completion's result"));
    report.check(late_ms <= (SWEEP_MS + 1000) as i64, format!("a deadline was found {late_ms} ms late"));
    report.check(count(Fate::Twice, "ingress_failed") == 0, "ingress failed to store a completion event");
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
