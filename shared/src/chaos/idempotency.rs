//! Scenario 8, idempotency under load: 1,000 keys × 20 submissions each over HTTP to
//! `relay serve`, in concurrent bursts of 50 where the same key races itself; every fifth
//! replay changes the request. One job per key, every mismatched replay 422
//! `idempotency_key_reused`, every other replay 200 with the key's job, no 5xx.

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use serde_json::json;

use super::harness;
use super::{Env, Report};
use crate::platform::Settings;

const REPLAYS: usize = 20;
const BURST: usize = 50;

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("idempotency", env.scale);
    let keys = env.n(1000, 20);
    let scratch = env.scratch(Settings::default()).await?;
    let (_server, http) = harness::serve(&env.relay, &scratch.url, &[("RELAY_POOL_SIZE", "32".into())], &env.log("idem-serve")).await?;
    // (key, replay): replay r % 5 == 4 sends different params.
    let mut calls: Vec<(usize, usize)> = (0..keys).flat_map(|k| (0..REPLAYS).map(move |r| (k, r))).collect();
    calls.shuffle(&mut rand::rng());
    // Keep each key's requests close together so they race: sort by key block, shuffle within.
    calls.sort_by_key(|(k, _)| k / (BURST / 10).max(1));
    let http = Arc::new(http);
    let key = Arc::new(scratch.key.clone());
    let mut answers: Vec<(usize, bool, u16, Option<String>)> = Vec::new();
    let start = std::time::Instant::now();
    for burst in calls.chunks(BURST) {
        let tasks: Vec<_> = burst
            .iter()
            .map(|&(k, r)| {
                let (http, key) = (http.clone(), key.clone());
                tokio::spawn(async move {
                    let mismatch = r % 5 == 4;
                    let body = json!({"task_type": "noop", "params": {"echo": if mismatch { format!("other-{r}") } else { format!("k{k}") }}});
                    let (status, v) = http.call("POST", "/v1/jobs", Some(&key), Some(&format!("idem-{k}")), Some(&body)).await?;
                    anyhow::Ok((k, mismatch, status, v["id"].as_str().or(v["error"]["job_id"].as_str()).map(str::to_owned)))
                })
            })
            .collect();
        for t in tasks {
            answers.push(t.await??);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let db = scratch.platform.pool.get().await?;
    let jobs: i64 = db.query_one("SELECT count(*) FROM jobs", &[]).await?.get(0);
    let per_key_max: i64 = db
        .query_one("SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM job_keys GROUP BY idempotency_key) k", &[])
        .await?
        .get(0);
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    let mut ids_by_key: HashMap<usize, std::collections::HashSet<String>> = HashMap::new();
    let (mut mismatches, mut mismatch_422, mut created) = (0, 0, 0);
    for (k, mismatch, status, id) in &answers {
        *by_status.entry(*status).or_default() += 1;
        if *mismatch {
            mismatches += 1;
            if *status == 422 {
                mismatch_422 += 1;
            }
        }
        if *status == 202 {
            created += 1;
        }
        if let Some(id) = id {
            ids_by_key.entry(*k).or_default().insert(id.clone());
        }
    }
    let five_xx: usize = by_status.iter().filter(|(s, _)| **s >= 500).map(|(_, n)| n).sum();
    let split_keys = ids_by_key.values().filter(|ids| ids.len() > 1).count();
    // A mismatched request that came first creates the job (202); then the matching ones are
    // the "different request" and answer 422. Either way: one job per key.
    let refused: usize = by_status.get(&422).copied().unwrap_or(0);
    report.fig("keys × submissions", format!("{keys} × {REPLAYS}"));
    report.fig("requests/s", answers.len() as f64 / elapsed);
    report.fig("answers by status", by_status.iter().map(|(s, n)| (s.to_string(), *n)).collect::<std::collections::BTreeMap<_, _>>());
    report.fig("jobs created (rows) / 202 answers", format!("{jobs} / {created}"));
    report.fig("mismatched replays / answered 422", format!("{mismatches} / {mismatch_422}"));
    report.fig("most jobs for one key", per_key_max);
    report.check(jobs == keys as i64 && created == keys, format!("{jobs} jobs and {created} 202s for {keys} keys"));
    report.check(per_key_max == 1 && split_keys == 0, format!("{split_keys} keys answered with more than one job id"));
    report.check(five_xx == 0, format!("{five_xx} answers were 5xx"));
    // Every mismatched replay of a key whose job was created by a matching request is 422.
    let created_by_match: std::collections::HashSet<usize> =
        answers.iter().filter(|(_, m, s, _)| *s == 202 && !*m).map(|(k, _, _, _)| *k).collect();
    let wrong = answers.iter().filter(|(k, m, s, _)| *m && created_by_match.contains(k) && *s != 422).count();
    report.check(wrong == 0, format!("{wrong} mismatched replays were not refused with 422"));
    let others = answers.len() - by_status.get(&202).copied().unwrap_or(0) - by_status.get(&200).copied().unwrap_or(0) - refused;
    report.check(others == 0, format!("{others} answers were neither 202, 200 nor 422"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
