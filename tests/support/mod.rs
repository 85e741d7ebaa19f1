//! The test harness: a real Postgres (DATABASE_URL, or a private cluster booted once per
//! run from the installed binaries), one fresh schema per test, migrated; HTTP through the
//! real router with `oneshot`.

pub mod aws_standin;
pub mod iam;
pub mod leaks;
pub mod moto;
pub mod runtime_api;
pub mod transports;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use relay::pgcluster::{Durability, PrivateCluster};
use serde_json::Value;
use taskdeck::platform::{Platform, Settings};
use taskdeck::store::tenants;
use tower::ServiceExt;

/// The server every test uses: `DATABASE_URL`, or a private cluster under the target dir,
/// stopped by a watchdog when this test process exits.
fn base_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            return url;
        }
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("relay-test-pg");
        let cluster = PrivateCluster::start(&dir, Durability::Throwaway).expect("boot a private Postgres cluster");
        cluster.stop_when_process_exits(std::process::id()).expect("cluster watchdog");
        cluster.url("postgres")
    })
}

/// The test server's URL (for building pools the way a Lambda container does).
pub fn database_url() -> String {
    base_url().to_owned()
}

/// A connection LISTENing on `channel` (listening when this returns), and the channel name of
/// each notification it receives. Keep the client: dropping it ends the listening.
pub async fn listen(channel: &str) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use futures::StreamExt;
    let (client, mut conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
    let (heard_tx, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = heard_tx.send(n.channel().to_owned());
            }
        }
    });
    client.batch_execute(&format!("LISTEN \"{channel}\"")).await.unwrap();
    (client, heard)
}

/// One test's world: its own schema, a platform wired to it, a tenant and its key.
pub struct World {
    pub platform: Platform,
    pub router: axum::Router,
    pub tenant: tenants::Tenant,
    pub key: String,
    pub schema: String,
}

/// Settings tuned for tests: short leases, quick polls, the test tasks on.
pub fn test_settings() -> Settings {
    let mut s = Settings { test_tasks: true, ..Settings::default() };
    s.executor.lease = Duration::from_secs(2);
    s.executor.poll_interval = Duration::from_millis(50);
    s.sweep.redispatch_grace = Duration::from_secs(1);
    s.sweep_interval = Duration::from_millis(200);
    s.pool.max_size = 12;
    s
}

impl World {
    pub async fn new() -> World {
        Self::with_settings(test_settings()).await
    }

    pub async fn with_settings(mut settings: Settings) -> World {
        let schema = new_schema().await;
        settings.pool.search_path = Some(schema.clone());
        let platform = Platform::new(base_url(), settings).expect("platform");
        platform.migrate().await.expect("migrate");
        let db = platform.pool.get().await.expect("connection");
        let (tenant, key) = tenants::create(&db, "acme").await.expect("tenant");
        drop(db);
        let router = taskdeck::api::router(platform.app_state());
        World { platform, router, tenant, key, schema }
    }

    /// Same schema, another transport (e.g. one that fails on purpose).
    pub fn with_transport(&self, transport: Arc<dyn taskdeck::transport::Transport>) -> World {
        let platform = self.platform.clone().with_transport(transport);
        World {
            router: taskdeck::api::router(platform.app_state()),
            platform,
            tenant: self.tenant.clone(),
            key: self.key.clone(),
            schema: self.schema.clone(),
        }
    }

    pub async fn db(&self) -> deadpool_postgres::Client {
        self.platform.pool.get().await.expect("connection")
    }

    /// Another tenant in the same schema; returns its key.
    pub async fn other_tenant(&self, name: &str) -> (tenants::Tenant, String) {
        tenants::create(&self.db().await, name).await.expect("tenant")
    }

    /// Call the API as this world's tenant.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        idem: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call_as(&self.key, method, path, idem, body.map(|b| b.to_string().into_bytes())).await
    }

    pub async fn call_as(
        &self,
        key: &str,
        method: Method,
        path: &str,
        idem: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path).header("authorization", format!("Bearer {key}"));
        if let Some(k) = idem {
            req = req.header("idempotency-key", k);
        }
        let req = match body {
            Some(b) => req.header("content-type", "application/json").body(Body::from(b)),
            None => req.body(Body::empty()),
        }
        .expect("request");
        send(&self.router, req).await
    }

    /// Submit one job; returns (status, body).
    pub async fn submit(&self, key: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/v1/jobs", Some(key), Some(body)).await
    }

    /// Poll a job until `pred` holds or `within` passes; returns the last read.
    pub async fn wait_for(&self, id: &str, within: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let (_, job) = self.call(Method::GET, &format!("/v1/jobs/{id}"), None, None).await;
            if pred(&job) || tokio::time::Instant::now() > deadline {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait (up to 5 s) until a count query returns `expected`; returns the last count.
    /// For effects that follow the answer, such as a failed dispatch clearing its mark.
    pub async fn eventually(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        expected: i64,
    ) -> i64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let n = self.count(sql, params).await;
            if n == expected || tokio::time::Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Count rows with a raw query (tests may write SQL).
    pub async fn count(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> i64 {
        self.db().await.query_one(sql, params).await.expect("count").get(0)
    }
}

pub async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let res = router.clone().oneshot(req).await.expect("router is infallible");
    let status = res.status();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    let body =
        if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("every answer is JSON") };
    (status, body)
}

/// A fresh schema nothing has migrated (for what migrates by itself: the pre-traffic hook).
pub async fn bare_schema() -> String {
    new_schema().await
}

/// A fresh schema named `t_<unix secs>_<random>`; schemas from runs over an hour old are
/// dropped on the first call of a run.
async fn new_schema() -> String {
    let (client, conn) =
        tokio_postgres::connect(base_url(), tokio_postgres::NoTls).await.expect("connect to test Postgres");
    tokio::spawn(conn);
    static CLEANED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    CLEANED
        .get_or_init(|| async {
            let cutoff = chrono::Utc::now().timestamp() - 3600;
            let old = client
                .query("SELECT nspname FROM pg_namespace WHERE nspname ~ '^t_[0-9]+_[0-9a-f]+$'", &[])
                .await
                .expect("list schemas");
            for row in old {
                let name: String = row.get(0);
                let secs: i64 = name.split('_').nth(1).and_then(|s| s.parse().ok()).unwrap_or(i64::MAX);
                if secs < cutoff {
                    let _ = client.batch_execute(&format!("DROP SCHEMA {name} CASCADE")).await;
                }
            }
        })
        .await;
    let name = format!("t_{}_{}", chrono::Utc::now().timestamp(), uuid::Uuid::now_v7().simple());
    client.batch_execute(&format!("CREATE SCHEMA {name}")).await.expect("create schema");
    name
}
