//! The chaos suite's fast subset: the scenarios `relay chaos` runs, scaled down, against the
//! test Postgres, moto and real `relay` child processes. Each fails on any violation. The
//! full runs (`relay chaos all`) and their last figures are in the README.

use std::path::PathBuf;

use relay::chaos::{self, Env, Report};

async fn scenario(name: &str, scale: f64) -> Report {
    let env = Env::new(
        super::support::database_url(),
        PathBuf::from(env!("CARGO_BIN_EXE_relay")),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        scale,
    )
    .with_moto(super::support::moto::endpoint());
    let report = chaos::run(name, &env).await.unwrap_or_else(|e| panic!("{name} could not run: {e:#}"));
    report.print();
    assert!(report.violations.is_empty(), "{name}: {:?}", report.violations);
    report
}

fn number(report: &Report, figure: &str) -> f64 {
    report.figure(figure).and_then(|v| v.as_f64()).unwrap_or_else(|| panic!("no figure {figure:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn duplicate_deliveries_are_claimed_once_and_counted() {
    let r = scenario("duplicates", 0.05).await;
    for t in ["sqs", "postgres"] {
        assert!(
            number(&r, &format!("{t}: duplicate deliveries observed")) >= 100.0,
            "2-5 copies of 100 jobs reached the executor"
        );
        assert_eq!(number(&r, &format!("{t}: jobs whose observed deliveries differ from copies sent")), 0.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_and_failed_dispatches_are_resent_by_the_sweep() {
    let r = scenario("lost-dispatch", 0.06).await;
    assert!(number(&r, "redispatched events") > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_zombie_changes_no_row() {
    let r = scenario("zombie", 0.1).await;
    assert_eq!(number(&r, "rows changed after the zombie resumed"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_messages_are_kept_and_healthy_records_run_once() {
    scenario("poison", 0.1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_holds_under_concurrent_replays_across_tenants() {
    let r = scenario("idempotency", 0.05).await;
    assert_eq!(number(&r, "pairs answered with more than one job id"), 0.0);
    assert_eq!(number(&r, "answers naming another tenant's job"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_ids_and_keys_are_indistinguishable_from_missing() {
    let r = scenario("isolation", 0.1).await;
    assert_eq!(number(&r, "cells distinguishable from not-found"), 0.0);
    assert_eq!(number(&r, "A's rows changed by B's calls"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn random_and_near_miss_keys_are_refused_and_never_logged() {
    scenario("auth", 0.02).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_workers_lose_nothing_and_recoveries_are_recorded() {
    let r = scenario("kill9", 0.05).await;
    assert!(number(&r, "recoveries (lease_expired events)") > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_outage_answers_202_and_everything_runs_after() {
    scenario("queue-outage", 0.05).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_answers_503_and_workers_recover_without_restart() {
    scenario("db-outage", 0.05).await;
}

/// Found by the database-outage scenario: a fast shutdown terminates sessions in flight with
/// 57P01 (admin_shutdown), which has an error code and so was taken for a refused statement
/// and answered 500. It is the database going away: 503.
#[tokio::test]
async fn a_session_terminated_by_the_server_is_an_outage_not_a_500() {
    let w = super::support::World::new().await;
    let victim = w.db().await;
    let pid: i32 = victim.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    // Terminated mid-statement, the statement's answer is the server's FATAL 57P01.
    let in_flight = tokio::spawn(async move { victim.query_one("SELECT pg_sleep(10)", &[]).await.map(|_| ()) });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    w.db().await.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    let err = in_flight.await.expect("join").expect_err("the session is gone");
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err}");
    let err = taskdeck::store::StoreError::from(err);
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(taskdeck::api::error::ApiError::from(err).status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
}

/// Found by the idempotency scenario: two coalesced inserts holding the same keys in opposite
/// orders deadlocked (40P01, answered 500). Keys are now inserted in key order.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_inserts_sharing_keys_in_any_order_do_not_deadlock() {
    use taskdeck::store::jobs::{self, NewJob};
    let w = super::support::World::new().await;
    use taskdeck::job::terms::{IdempotencyKey, Limits};
    let job = |round: usize, k: usize| NewJob {
        limits: Limits::fixed(1, 10),
        ..NewJob::new("noop", serde_json::json!({}), IdempotencyKey::parse(&format!("r{round}-k{k}")).unwrap())
    };
    for round in 0..30 {
        let forward: Vec<NewJob> = (0..40).map(|k| job(round, k)).collect();
        let backward: Vec<NewJob> = (0..40).rev().map(|k| job(round, k)).collect();
        let (a, b) = (w.db().await, w.db().await);
        let tenant = w.tenant.id;
        let (ra, rb) =
            tokio::join!(jobs::insert_many(&a, tenant, &forward, None), jobs::insert_many(&b, tenant, &backward, None));
        ra.expect("forward insert");
        rb.expect("backward insert");
    }
    assert_eq!(w.count("SELECT count(*) FROM jobs", &[]).await, 30 * 40);
}

/// Repeats of a key in one coalesced insert: the first item takes the key (its request made
/// the job), whatever the key order the insert locks in.
#[tokio::test]
async fn the_first_repeat_of_a_key_in_one_insert_makes_the_job() {
    use taskdeck::store::jobs::{self, Inserted, NewJob};
    let w = super::support::World::new().await;
    use taskdeck::job::terms::{IdempotencyKey, Limits};
    let item = |n: i32| NewJob {
        limits: Limits::fixed(1, 10),
        ..NewJob::new(
            "noop",
            serde_json::json!({"n": n}),
            IdempotencyKey::parse(if n == 0 { "b" } else { "same" }).unwrap(),
        )
    };
    let batch: Vec<NewJob> = (1..=8).chain([0]).map(item).collect();
    let out = jobs::insert_many(&w.db().await, w.tenant.id, &batch, None).await.expect("insert");
    let Inserted::Created(first) = &out[0] else { panic!("the first item creates") };
    assert_eq!(first.params, serde_json::json!({"n": 1}));
    assert!(out[1..8].iter().all(|i| matches!(i, Inserted::Existing(j) if j.id == first.id)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_faulty_destination_gets_one_call_per_cut_or_slow_answer_and_retries_under_one_key() {
    let r = scenario("destination", 0.06).await;
    assert!(number(&r, "faults injected: answers cut mid-body") >= 3.0);
    assert!(number(&r, "faults injected: slow answers (after the timeout)") >= 3.0);
    assert_eq!(number(&r, "calls under a key no job has"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn completions_arriving_twice_late_or_never_apply_once_or_are_swept() {
    let r = scenario("completions", 0.1).await;
    assert!(number(&r, "completion copies sent for the 'twice' jobs") > 10.0, "copies really arrived");
    assert!(number(&r, "deadlines passed with no completion (swept)") >= 20.0, "deadlines really passed");
    assert_eq!(number(&r, "jobs that ended an attempt twice"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_tenants_latency_stays_within_twice_its_solo_figure_beside_noisy_neighbours() {
    let r = scenario("neighbours", 0.1).await;
    assert!(number(&r, "noisy tenant's calls still hanging at the end (its destination's max_in_flight)") > 0.0);
    // X was sending at the account's rate when the victim's sends came (its first 10 at SES
    // first, with its queue or campaign far from done); how many more of X's went beside the
    // victim's five depends on whose slots came first.
    for phase in ["beside 30 queued sends", "beside a campaign of 1000"] {
        assert!(number(&r, &format!("{phase}: noisy tenant's sends at SES by the victim's last")) >= 10.0);
    }
}
