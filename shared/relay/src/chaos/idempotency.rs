//! Scenario 8, idempotency under load: several tenants use the SAME idempotency keys, 20
//! submissions per tenant and key over HTTP to `relay serve`, every tenant's requests for a key
//! racing each other and the other tenants' in one concurrent burst; every fifth replay
//! changes the request. Checked against the rows, answer by answer: each tenant has exactly one
//! job per key, its own, holding the body of the one request answered 202; every answer names
//! that job; a body other than the stored one is refused 422 `idempotency_key_reused`, the
//! stored body is answered 200/202; no 5xx.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use rand::seq::SliceRandom;
use serde_json::{Value, json};

use super::harness;
use super::{Env, Report};
use taskdeck::platform::Settings;
use taskdeck::store::tenants;
use taskdeck::store::tooling::readouts;

const TENANTS: usize = 4;
const REPLAYS: usize = 20;
/// Keys raced at once: every tenant's replays of these keys go out together.
const KEYS_PER_BURST: usize = 2;

/// One answer: (tenant, key, body sent, status, job id named).
type Answer = (usize, usize, Value, u16, Option<String>);

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("idempotency", env.scale);
    let keys = env.n(250, 10);
    let scratch = env.scratch(Settings::default()).await?;
    let mut tenant_ids = vec![scratch.tenant.id];
    let mut tenant_keys = vec![scratch.key.clone()];
    for t in 1..TENANTS {
        let (tenant, key) = tenants::create(&scratch.platform.pool.get().await?, &format!("idem-{t}")).await?;
        tenant_ids.push(tenant.id);
        tenant_keys.push(key);
    }
    let (_server, http) =
        harness::serve(&env.relay, &scratch.url, &[("RELAY_POOL_SIZE", "32".into())], &env.log("idem-serve")).await?;
    let http = Arc::new(http);
    let tenant_keys = Arc::new(tenant_keys);
    let mut answers: Vec<Answer> = Vec::new();
    let start = std::time::Instant::now();
    let all_keys: Vec<usize> = (0..keys).collect();
    for group in all_keys.chunks(KEYS_PER_BURST) {
        // (tenant, key, replay), shuffled: tenants and replays interleave.
        let mut burst: Vec<(usize, usize, usize)> =
            group.iter().flat_map(|&k| (0..TENANTS).flat_map(move |t| (0..REPLAYS).map(move |r| (t, k, r)))).collect();
        burst.shuffle(&mut rand::rng());
        let tasks: Vec<_> = burst
            .into_iter()
            .map(|(t, k, r)| {
                let (http, tenant_keys) = (http.clone(), tenant_keys.clone());
                tokio::spawn(async move {
                    // The same body for the same key in every tenant; every fifth replay differs.
                    let echo = if r % 5 == 4 { format!("other-{r}") } else { format!("k{k}") };
                    let body = json!({"task_type": "noop", "params": {"echo": echo}});
                    let (status, v) = http
                        .call("POST", "/v1/jobs", Some(&tenant_keys[t]), Some(&format!("idem-{k}")), Some(&body))
                        .await?;
                    let id = v["id"].as_str().or(v["error"]["job_id"].as_str()).map(str::to_owned);
                    anyhow::Ok((t, k, body["params"].clone(), status, id))
                })
            })
            .collect();
        for task in tasks {
            answers.push(task.await??);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();

    // The rows: (tenant, key) -> [(job id, params)], and every job's owner.
    let db = scratch.platform.pool.get().await?;
    let mut rows: HashMap<(usize, usize), Vec<(String, Value)>> = HashMap::new();
    let mut owner: HashMap<String, usize> = HashMap::new();
    for job in readouts::jobs(&db).await? {
        let (tenant, key, id, params) = (job.tenant_id, job.idempotency_key, job.id, job.params);
        let t = tenant_ids.iter().position(|x| *x == tenant).unwrap_or(usize::MAX);
        let k: usize = key.trim_start_matches("idem-").parse().unwrap_or(usize::MAX);
        owner.insert(id.to_string(), t);
        rows.entry((t, k)).or_default().push((id.to_string(), params));
    }
    let pairs = TENANTS * keys;
    let one_each = (0..TENANTS)
        .flat_map(|t| (0..keys).map(move |k| (t, k)))
        .filter(|p| rows.get(p).is_some_and(|v| v.len() == 1))
        .count();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    let mut created: HashMap<(usize, usize), Vec<&Value>> = HashMap::new();
    let (mut wrong_job, mut foreign, mut wrong_verdict, mut mismatched, mut refused) = (0, 0, 0, 0, 0);
    let mut named: HashMap<(usize, usize), HashSet<&str>> = HashMap::new();
    for (t, k, body, status, id) in &answers {
        *by_status.entry(*status).or_default() += 1;
        if *status == 202 {
            created.entry((*t, *k)).or_default().push(body);
        }
        let Some((job, stored)) = rows.get(&(*t, *k)).and_then(|v| v.first()) else { continue };
        if let Some(id) = id {
            named.entry((*t, *k)).or_default().insert(id.as_str());
            if owner.get(id).is_some_and(|o| o != t) {
                foreign += 1;
            }
        }
        if id.as_deref() != Some(job.as_str()) {
            wrong_job += 1;
        }
        // The verdict follows the stored body: the same body is the job, another is refused.
        let differs = body != stored;
        mismatched += usize::from(differs);
        refused += usize::from(differs && *status == 422);
        if differs != (*status == 422) || (!differs && ![200, 202].contains(status)) {
            wrong_verdict += 1;
        }
    }
    let one_202 = created.values().filter(|v| v.len() == 1).count();
    // The stored body is the body of the one request answered 202.
    let creator_stored = created
        .iter()
        .filter(|(p, bodies)| {
            bodies.len() == 1 && rows.get(p).and_then(|v| v.first()).is_some_and(|(_, stored)| stored == bodies[0])
        })
        .count();
    let split = named.values().filter(|ids| ids.len() > 1).count();
    let five_xx: usize = by_status.iter().filter(|(s, _)| **s >= 500).map(|(_, n)| n).sum();
    let jobs: usize = rows.values().map(Vec::len).sum();
    report.fig("tenants × shared keys × submissions", format!("{TENANTS} × {keys} × {REPLAYS}"));
    report.fig("requests/s", answers.len() as f64 / elapsed);
    report.fig("answers by status", &by_status);
    report.fig("jobs (rows) / (tenant, key) pairs", format!("{jobs} / {pairs}"));
    report.fig("pairs with exactly one job / exactly one 202", format!("{one_each} / {one_202}"));
    report.fig("pairs whose job holds the 202 request's body", creator_stored);
    report.fig("pairs answered with more than one job id", split);
    report.fig("answers naming another tenant's job", foreign);
    report.fig("answers not naming the pair's job", wrong_job);
    report.fig("requests differing from the stored body / refused 422", format!("{mismatched} / {refused}"));
    report.fig("answers whose verdict disagrees with the stored body", wrong_verdict);
    report.check(
        jobs == pairs && one_each == pairs,
        format!("{jobs} jobs, {one_each} of {pairs} (tenant, key) pairs with exactly one"),
    );
    report.check(
        one_202 == pairs && creator_stored == pairs,
        format!("{one_202} of {pairs} pairs answered 202 once, {creator_stored} hold that request's body"),
    );
    report.check(
        split == 0 && wrong_job == 0,
        format!("{split} pairs answered with several job ids, {wrong_job} answers not naming the pair's job"),
    );
    report.check(foreign == 0, format!("{foreign} answers named another tenant's job"));
    report.check(
        mismatched > 0 && wrong_verdict == 0,
        format!("{wrong_verdict} answers contradict the stored body (422 iff it differs)"),
    );
    report.check(five_xx == 0, format!("{five_xx} answers were 5xx"));
    drop(db);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
