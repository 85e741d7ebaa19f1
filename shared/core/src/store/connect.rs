//! How the pool opens a connection: TLS as `sslmode` says (`tls`), and, when a secret is
//! configured, the login from it (`secret`), read again once when Postgres refuses it.

use std::sync::Arc;

use deadpool_postgres::Connect;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::secret::{DbSecret, Login};

pub(super) struct Connector {
    pub tls: MakeRustlsConnect,
    pub secret: Option<Arc<DbSecret>>,
}

impl Connect for Connector {
    fn connect(&self, config: &Config) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let mut config = config.clone();
        Box::pin(async move {
            let Some(secret) = &self.secret else { return open(&config, &self.tls).await };
            // A secret that cannot be read leaves the URL's login: Postgres's refusal is then
            // the error, and the log line says why.
            let seen = match secret.current().await {
                Ok((generation, login)) => {
                    apply(&mut config, &login);
                    generation
                }
                Err(e) => {
                    tracing::error!(event = "relay.db.secret_unreadable", error = %e, "database secret not read");
                    0
                }
            };
            match open(&config, &self.tls).await {
                Err(e) if refused_login(&e) => {
                    let login = match secret.refresh(seen).await {
                        Ok((_, login)) => login,
                        Err(read) => {
                            tracing::error!(event = "relay.db.secret_unreadable", error = %read, "database secret not read again");
                            return Err(e);
                        }
                    };
                    tracing::info!(event = "relay.db.secret_reread", "login refused; secret read again (rotated?)");
                    apply(&mut config, &login);
                    open(&config, &self.tls).await
                }
                other => other,
            }
        })
    }
}

fn apply(config: &mut Config, login: &Login) {
    if let Some(user) = &login.username {
        config.user(user);
    }
    config.password(login.password.as_bytes());
}

/// A wrong password (28P01) or a login the server or RDS Proxy refuses (28000).
fn refused_login(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| matches!(c.code(), "28P01" | "28000"))
}

async fn open(config: &Config, tls: &MakeRustlsConnect) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
    let (client, connection) = config.connect(tls.clone()).await?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(event = "relay.db.connection_error", error = %e, "database connection ended");
        }
    });
    Ok((client, task))
}
