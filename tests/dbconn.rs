//! How the pool reaches Postgres in production: TLS by `sslmode`/`sslrootcert` against a
//! private cluster with `ssl=on` and a CA made here with the openssl CLI, and the login read
//! from a Secrets Manager secret (moto) and read again after the password is rotated.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use relay::pgcluster::{Durability, PrivateCluster};
use taskdeck::store::{self, PoolOptions, secret::DbSecret};

use crate::support::moto;

/// A CA and a server certificate for `localhost` signed by it, plus a second, unrelated CA.
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    cert: String,
    key: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl CLI");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn pki(dir: &Path) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    make_ca(dir, "relay-test-ca");
    make_ca(dir, "unrelated-ca");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "relay-test-ca.pem",
            "-CAkey",
            "relay-test-ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.crt",
            "-extfile",
            "server.ext",
        ],
    );
    Pki {
        ca: dir.join("relay-test-ca.pem"),
        other_ca: dir.join("unrelated-ca.pem"),
        cert: std::fs::read_to_string(dir.join("server.crt")).unwrap(),
        key: std::fs::read_to_string(dir.join("server.key")).unwrap(),
    }
}

/// One TLS cluster per test run (password logins for every role but `postgres`).
fn secure() -> &'static (PrivateCluster, Pki) {
    static CLUSTER: OnceLock<(PrivateCluster, Pki)> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.join(format!("relay-tls-pg-{}", std::process::id()));
        let pki = pki(&tmp.join(format!("relay-tls-pki-{}", std::process::id())));
        let cluster =
            PrivateCluster::start_tls(&dir, Durability::Throwaway, &pki.cert, &pki.key).expect("boot a TLS cluster");
        cluster.stop_when_process_exits(std::process::id()).expect("cluster watchdog");
        (cluster, pki)
    })
}

/// `SELECT ssl FROM pg_stat_ssl` for a one-connection pool on `url`.
async fn encrypted(url: &str, opts: &PoolOptions) -> Result<bool, String> {
    let pool = store::pool(url, opts).map_err(|e| format!("{e:#}"))?;
    let db = pool.get().await.map_err(|e| store::StoreError::from(e).to_string())?;
    let row = db
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test]
async fn verify_full_connects_with_the_right_ca_and_refuses_another() {
    let (c, pki) = secure();
    let url = |host: &str, mode: &str, ca: &Path| {
        format!("postgres://postgres@{host}:{}/postgres?sslmode={mode}&sslrootcert={}", c.port, ca.display())
    };
    let opts = PoolOptions::default();
    assert_eq!(encrypted(&url("localhost", "verify-full", &pki.ca), &opts).await, Ok(true));

    let wrong = encrypted(&url("localhost", "verify-full", &pki.other_ca), &opts).await.unwrap_err();
    assert!(wrong.contains("invalid peer certificate") && wrong.contains("UnknownIssuer"), "{wrong}");
    let wrong = encrypted(&url("localhost", "verify-ca", &pki.other_ca), &opts).await.unwrap_err();
    assert!(wrong.contains("UnknownIssuer"), "{wrong}");

    // The certificate names localhost, not 127.0.0.1: verify-full refuses, verify-ca accepts.
    let name = encrypted(&url("127.0.0.1", "verify-full", &pki.ca), &opts).await.unwrap_err();
    assert!(name.contains("invalid peer certificate") && name.contains("not valid for name"), "{name}");
    assert_eq!(encrypted(&url("127.0.0.1", "verify-ca", &pki.ca), &opts).await, Ok(true));
}

#[tokio::test]
async fn require_and_prefer_encrypt_without_a_ca_and_disable_does_not() {
    let (c, _) = secure();
    let url = |mode: &str| format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode={mode}", c.port);
    let opts = PoolOptions::default();
    assert_eq!(encrypted(&url("require"), &opts).await, Ok(true));
    assert_eq!(encrypted(&url("prefer"), &opts).await, Ok(true));
    assert_eq!(encrypted(&url("disable"), &opts).await, Ok(false));
    // A server without TLS (the harness's private cluster; not a DATABASE_URL server with
    // ssl on): prefer falls back to plain, verify-full refuses.
    let plain = crate::support::database_url();
    let with = |mode: &str| format!("{plain}{}sslmode={mode}", if plain.contains('?') { '&' } else { '?' });
    let db = store::pool(&with("disable"), &opts).unwrap().get().await.unwrap();
    let ssl_on: String = db.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    if ssl_on == "off" {
        assert_eq!(encrypted(&with("prefer"), &opts).await, Ok(false));
        let refused = encrypted(&with("verify-full"), &opts).await.unwrap_err();
        assert!(refused.contains("server does not support TLS"), "{refused}");
    }
}

async fn admin(c: &PrivateCluster) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&c.url("postgres"), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

#[tokio::test]
async fn a_rotated_password_is_read_again_from_the_secret_without_a_restart() {
    let (c, pki) = secure();
    let role = format!("relay_{}", uuid::Uuid::now_v7().simple());
    let db = admin(c).await;
    db.batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD 'first-pass'")).await.unwrap();

    let sm = aws_sdk_secretsmanager::Client::new(&moto::sdk_config());
    let secret = sm
        .create_secret()
        .name(format!("relay-db-{role}"))
        .secret_string(serde_json::json!({"username": role, "password": "first-pass"}).to_string())
        .send()
        .await
        .expect("create secret")
        .arn
        .unwrap();
    let login = Arc::new(DbSecret::new(&moto::sdk_config(), &secret));
    // The URL names no password: the secret supplies the login, over verify-full TLS.
    let url = format!("postgres://localhost:{}/postgres?sslmode=verify-full&sslrootcert={}", c.port, pki.ca.display());
    let opts = PoolOptions { max_size: 1, verify_on_checkout: true, secret: Some(login.clone()), ..Default::default() };
    let pool = store::pool(&url, &opts).unwrap();
    let whoami = |pool: deadpool_postgres::Pool| async move {
        let db = pool.get().await.map_err(|e| store::StoreError::from(e).to_string())?;
        let row = db.query_one("SELECT current_user::text", &[]).await.map_err(|e| e.to_string())?;
        Ok::<String, String>(row.get(0))
    };
    assert_eq!(whoami(pool.clone()).await.as_deref(), Ok(role.as_str()));
    assert_eq!(login.reads(), 1);

    // Rotation: the database and then the secret change; the open connection is ended.
    db.batch_execute(&format!("ALTER ROLE {role} PASSWORD 'second-pass'")).await.unwrap();
    sm.put_secret_value()
        .secret_id(&secret)
        .secret_string(serde_json::json!({"username": role, "password": "second-pass"}).to_string())
        .send()
        .await
        .unwrap();
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", &[&role]).await.unwrap();
    // The same pool (no restart): the next connection is refused with the kept password,
    // reads the secret again, and gets in.
    assert_eq!(whoami(pool.clone()).await.as_deref(), Ok(role.as_str()));
    assert_eq!(login.reads(), 2, "read once more after the refusal");

    // A password the secret does not hold: the refusal reaches the caller, named.
    db.batch_execute(&format!("ALTER ROLE {role} PASSWORD 'third-pass'")).await.unwrap();
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", &[&role]).await.unwrap();
    let refused = whoami(pool.clone()).await.unwrap_err();
    assert!(refused.contains("password authentication failed"), "{refused}");
    assert_eq!(login.reads(), 3);
}
