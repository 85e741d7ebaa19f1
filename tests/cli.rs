//! The `relay` binary as an operator runs it, against one test's schema: operator key
//! rotation, tenant identities, and `relay jobs list|show|watch`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use taskdeck::store::operators;

use relay::bench::setup::url_with_schema;

use crate::support::{World, database_url};

fn schema_url(schema: &str) -> String {
    url_with_schema(&database_url(), schema)
}

fn relay(w: &World, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(args)
        .env("DATABASE_URL", schema_url(&w.schema))
        .env("RELAY_LOG", "warn")
        .output()
        .expect("run relay");
    assert!(out.status.success(), "relay {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[tokio::test]
async fn an_operator_key_rotates_and_the_old_one_stops() {
    let w = World::new().await;
    let old = operators::create(&w.db().await, "ops").await.unwrap().1;
    let new = stdout(&relay(&w, &["operator", "rotate", "ops"]));
    assert!(new.starts_with("ro_") && new != old, "{new}");
    let (status, _) = w.call_as(&old, Method::GET, "/v1/admin/modes", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = w.call_as(&new, Method::GET, "/v1/admin/modes", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["operator", "rotate", "nobody"])
        .env("DATABASE_URL", schema_url(&w.schema))
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unknown operator is an error");
}

#[tokio::test]
async fn tenants_show_their_id_and_take_sending_identities() {
    let w = World::new().await;
    let set: Value = serde_json::from_str(&stdout(&relay(
        &w,
        &["tenant", "identities", "acme", "Acme.example", "ops@globex.example"],
    )))
    .unwrap();
    assert_eq!(set["sending_identities"], json!(["acme.example", "ops@globex.example"]));
    let shown: Value = serde_json::from_str(&stdout(&relay(&w, &["tenant", "show", "acme"]))).unwrap();
    assert_eq!(shown["id"], w.tenant.id.to_string(), "the id RELAY_TENANT_TASK_ROLES is keyed by");
    assert_eq!(shown["sending_identities"], set["sending_identities"]);
    let bad = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["tenant", "identities", "acme", "not a domain"])
        .env("DATABASE_URL", schema_url(&w.schema))
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[tokio::test]
async fn jobs_are_listed_shown_and_watched_to_the_end() {
    let w = World::new().await;
    let (_, done) = w.submit("done", json!({"task_type": "noop", "correlation_id": "cli-1"})).await;
    let id = done["id"].as_str().unwrap().to_owned();
    w.platform.executor().run_dispatched(&[id.parse().unwrap()]).await.unwrap();

    let list = stdout(&relay(&w, &["jobs", "--tenant", "acme", "list", "--status", "succeeded"]));
    assert!(list.lines().any(|l| l.starts_with(&id) && l.contains("noop") && l.contains("cli-1")), "{list}");
    let shown: Value = serde_json::from_str(&stdout(&relay(&w, &["jobs", "--tenant", "acme", "show", &id]))).unwrap();
    assert_eq!(shown["job"]["status"], "succeeded");
    // Submitted, claimed, succeeded: in order, each with its time.
    let events = shown["events"].as_array().unwrap();
    let steps: Vec<(&str, &str)> =
        events.iter().map(|e| (e["kind"].as_str().unwrap(), e["at"].as_str().unwrap())).collect();
    assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), ["submitted", "claimed", "succeeded"], "{shown}");
    let at: Vec<chrono::DateTime<chrono::Utc>> = steps.iter().map(|s| s.1.parse().unwrap()).collect();
    assert!(at[0] <= at[1] && at[1] <= at[2], "{shown}");
    assert_eq!(
        shown["job"]["created_at"].as_str().map(|t| t.parse::<chrono::DateTime<chrono::Utc>>().unwrap()),
        Some(at[0])
    );
    assert_eq!(events[2]["started_at"], events[1]["at"], "the claim is the attempt's start");

    // `watch` returns once the job is terminal: start it on a pending job, then run the job.
    let (_, pending) = w.submit("later", json!({"task_type": "noop"})).await;
    let pid = pending["id"].as_str().unwrap().to_owned();
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["jobs", "--tenant", "acme", "watch", &pid, "--every", "0.1"])
        .env("DATABASE_URL", schema_url(&w.schema))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(watch.try_wait().unwrap().is_none(), "still watching a pending job");
    let started = Instant::now();
    w.platform.executor().run_dispatched(&[pid.parse().unwrap()]).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), watch.wait()).await.expect("watch ends").unwrap();
    assert!(status.success());
    assert!(started.elapsed() < Duration::from_secs(5));
    let (status, _) = w.call(Method::GET, &format!("/v1/jobs/{pid}"), None, None).await;
    assert_eq!(status, StatusCode::OK);

    // Piped, `watch` prints a line per change and exits non-zero when the job failed.
    let piped = relay(&w, &["jobs", "--tenant", "acme", "watch", &pid]);
    assert!(stdout(&piped).contains("noop succeeded"), "{}", stdout(&piped));
    let (_, bad) = w.submit("fails", json!({"task_type": "test.fail", "params": {"times": 9, "kind": "fatal"}})).await;
    let bid = bad["id"].as_str().unwrap().to_owned();
    w.platform.executor().run_dispatched(&[bid.parse().unwrap()]).await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["jobs", "--tenant", "acme", "watch", &bid])
        .env("DATABASE_URL", schema_url(&w.schema))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a failed job's watch fails");
    assert!(stdout(&out).contains("test.fail failed"), "{}", stdout(&out));
    // `list` shows the newest change first.
    let list = stdout(&relay(&w, &["jobs", "--tenant", "acme", "list"]));
    let rows: Vec<&str> = list.lines().skip(1).collect();
    assert!(rows[0].starts_with(&bid) && rows.last().unwrap().starts_with(&id), "{list}");
}

/// `relay bench` reads what each figure cost the database server's processes from `/proc`.
/// The harness's Postgres runs on this machine (unless `DATABASE_URL` names another host), so
/// its postmaster is found and its CPU time grows with the work sent to it.
#[tokio::test]
async fn the_bench_finds_the_local_database_server_and_its_cpu_time() {
    use relay::bench::cpu::{CpuTimes, postmaster_pid};
    use tokio_postgres::config::Host;
    let config: tokio_postgres::Config = database_url().parse().unwrap();
    let local = config.get_hosts().iter().all(|h| match h {
        Host::Tcp(name) => ["127.0.0.1", "localhost", "::1"].contains(&name.as_str()),
        Host::Unix(_) => true,
    });
    if !local {
        return;
    }
    let w = World::new().await;
    let db = w.db().await;
    let postmaster = postmaster_pid(&db).await;
    assert!(postmaster.is_some(), "the local server's postmaster");
    let before = CpuTimes::read(postmaster, None);
    db.batch_execute("SELECT count(*) FROM generate_series(1, 5000000)").await.unwrap();
    let cost = CpuTimes::read(postmaster, None).per_unit(before, 1);
    assert!(cost.postgres_us.unwrap() > 50_000.0, "{cost:?}");
    assert!(cost.ceiling_per_sec.is_some(), "{cost:?}");
}

/// `relay bench`'s cost per job reads what Postgres wrote: heap tuples of the test's own
/// schema by window (accept, then claim + complete), index entries, WAL from its position. 100
/// jobs accepted over the API and run by a worker cost at least a row each to accept, an update
/// each to run, and index entries in both windows; the table prints every row.
#[tokio::test]
async fn the_bench_counts_the_tuples_index_entries_and_wal_a_job_cost() {
    use relay::bench::setup::close_idle;
    use relay::bench::wal::{JobCost, Reading, lines};
    use taskdeck::store::tooling::bench::RELAY;
    const N: usize = 100;
    let w = World::new().await;
    let db = w.db().await;
    let r0 = Reading::take(&db, &w.schema, &RELAY).await.unwrap();
    for i in 0..N {
        let (status, _) = w.submit(&format!("cost-{i}"), json!({"task_type": "noop"})).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    // The API's connections hold their statistics while idle; closed, they send them.
    close_idle(&w.platform.pool);
    let r1 = Reading::take(&db, &w.schema, &RELAY).await.unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let handles = w.platform.spawn_workers(1, &stop);
    assert_eq!(w.eventually("SELECT count(*) FROM jobs WHERE status = 'succeeded'", &[], N as i64).await, N as i64);
    stop_tx.send(true).unwrap();
    for h in handles {
        h.await.unwrap();
    }
    close_idle(&w.platform.pool);
    let r2 = Reading::take(&db, &w.schema, &RELAY).await.unwrap();
    let cost = JobCost::between(&db, N, &r0, &r1, &r2).await.unwrap();
    let (accept, run) = (&cost.accept_window, &cost.processing_window);
    assert!(accept.inserted >= 1.0 && accept.updated == 0.0, "{accept:?}");
    assert!(run.updated >= 1.0 && run.hot_updated <= run.updated, "{run:?}");
    assert!(accept.index_entries >= 1.0 && run.index_entries > 0.0, "{cost:?}");
    assert!(accept.tables.iter().any(|t| t.table == "jobs" && t.inserted == N as i64), "{accept:?}");
    assert!(cost.total_wal_bytes > 100.0 && accept.wal_bytes > 0.0 && run.wal_bytes > 0.0, "{cost:?}");
    let table = lines("100, test", &cost, Some(("itself", &cost))).join("\n");
    for row in [
        "accept",
        "claim",
        "complete",
        "total (WAL position)",
        "heap ins/upd(HOT)/del: claim+complete",
        "index entries: accept",
    ] {
        assert!(table.contains(row), "{table}");
    }
    assert!(table.contains("itself: "), "{table}");
    // Every job's row has a primary key entry, named under the accept window.
    let pkey = accept.relations.iter().find(|r| r.relation == "jobs_pkey");
    assert!(pkey.is_some_and(|r| r.index_entries >= 1.0), "{:?}", accept.relations);
    let indexes: f64 = accept.relations.iter().map(|r| r.index_entries).sum();
    assert_eq!(indexes, accept.index_entries, "{:?}", accept.relations);
    assert!(table.contains("    jobs_pkey "), "{table}");
}

/// The bench's per-index counts are what the writes must produce, read back from the WAL:
/// in a table of the test's schema with an index on `v` and a partial one of open rows, an
/// insert adds an entry to each index whose predicate the row meets, a non-HOT update (of `v`)
/// another to each, a HOT update (of an unindexed column) none. Other tests writing at the same
/// time land in `(other)`, never in these.
#[tokio::test]
async fn the_bench_counts_index_entries_per_index_from_the_wal() {
    use relay::bench::wal::RelationWal;
    use taskdeck::store::tooling::bench::{enable_statement_counts, wal_position, wal_records_between};
    let w = World::new().await;
    let db = w.db().await;
    enable_statement_counts(&db).await;
    if w.count("SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'", &[]).await == 0 {
        eprintln!("skipped: pg_walinspect is not installed on this server");
        return;
    }
    db.batch_execute(
        "CREATE TABLE walcount (id int NOT NULL, state text NOT NULL, v int NOT NULL, note text);
         CREATE INDEX walcount_v ON walcount (v);
         CREATE INDEX walcount_open ON walcount (id) WHERE state = 'open'",
    )
    .await
    .unwrap();
    let from = wal_position(&db).await.unwrap();
    db.batch_execute(
        "INSERT INTO walcount SELECT i, CASE WHEN i <= 4 THEN 'open' ELSE 'done' END, i FROM generate_series(1, 10) i;
         UPDATE walcount SET v = v + 100 WHERE id <= 6;
         UPDATE walcount SET note = 'hot' WHERE id = 10",
    )
    .await
    .unwrap();
    let to = wal_position(&db).await.unwrap();
    let records = wal_records_between(&db, &w.schema, from, to).await.unwrap().expect("the window's WAL is on disk");
    let relations = RelationWal::from_records(&records, 1.0);
    let of = |name: &str| relations.iter().find(|r| r.relation == name).cloned().unwrap_or_default();
    // 10 inserts + 6 updates of v; 4 open inserts + 4 updates of open rows (5 and 6 are done).
    assert_eq!(of("walcount_v").index_entries, 16.0, "{relations:?}");
    assert_eq!(of("walcount_open").index_entries, 8.0, "{relations:?}");
    // 10 inserts, 6 updates, 1 HOT update: heap records of the table, no entries.
    assert_eq!((of("walcount").heap_records, of("walcount").index_entries), (17.0, 0.0), "{relations:?}");
    let named: Vec<&str> = relations.iter().map(|r| r.relation.as_str()).filter(|r| *r != "(other)").collect();
    assert!(named.iter().all(|r| r.starts_with("walcount")), "{relations:?}");
}

/// A child process killed when dropped (the test's `relay serve` / `relay worker`).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_relay(w: &World, args: &[&str]) -> Child {
    Child(
        Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(args)
            .env("DATABASE_URL", schema_url(&w.schema))
            .env("RELAY_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn relay"),
    )
}

/// `relay serve` on a free port, answering.
async fn serve(w: &World) -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = spawn_relay(w, &["serve", "--addr", &format!("127.0.0.1:{port}")]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "relay serve did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, format!("http://127.0.0.1:{port}"))
}

async fn smoke(url: &str, key: &str, within: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["smoke", "--within", within])
        .env("RELAY_API_URL", url)
        .env("RELAY_API_KEY", key)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("run relay smoke");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn smoke_passes_when_a_worker_runs_the_job_through_the_public_api() {
    let w = World::new().await;
    let (_api, url) = serve(&w).await;
    let _worker = spawn_relay(&w, &["worker", "--workers", "1"]);
    let (ok, stdout, stderr) = smoke(&url, &w.key, "30").await;
    assert!(ok, "smoke failed: {stderr}");
    assert!(stdout.contains("succeeded"), "{stdout}");
    // It really went through the API as this tenant: one noop job, succeeded.
    let n = w
        .count(
            "SELECT count(*) FROM jobs WHERE task_type = 'noop' AND status = 'succeeded' AND tenant_id = $1",
            &[&w.tenant.id],
        )
        .await;
    assert_eq!(n, 1);
}

#[tokio::test]
async fn smoke_fails_with_what_it_saw_when_no_worker_runs_or_the_key_is_wrong() {
    let w = World::new().await;
    let (_api, url) = serve(&w).await;
    let started = Instant::now();
    let (ok, _, stderr) = smoke(&url, &w.key, "3").await;
    assert!(!ok, "no worker: the job cannot succeed");
    assert!(stderr.contains("did not succeed within 3 s") && stderr.contains("\"pending\""), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(15), "bounded");
    let (ok, _, stderr) = smoke(&url, "rk_not-a-key", "3").await;
    assert!(!ok);
    assert!(stderr.contains("submit: Relay answered 401"), "{stderr}");
    // Nothing listening.
    drop(_api);
    let (ok, _, stderr) = smoke(&url, &w.key, "3").await;
    assert!(!ok);
    assert!(stderr.contains("submit: request failed") && stderr.contains("onnect"), "{stderr}");
}
