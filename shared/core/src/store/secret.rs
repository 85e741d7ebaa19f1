//! The database login read at run time from Secrets Manager (`RELAY_DATABASE_SECRET`), so no
//! password sits in a function's environment and a rotated secret needs no redeploy: the login
//! is read once, kept, and read again when Postgres refuses it.
//!
//! The secret is the JSON RDS and RDS Proxy use: `password`, and `username` when present
//! (so the "alternating users" rotation strategy works too).

use std::sync::atomic::{AtomicU64, Ordering};

use aws_sdk_secretsmanager::error::DisplayErrorContext;
use tokio::sync::Mutex;

/// A login read from the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub username: Option<String>,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("username", &self.username).field("password", &"<hidden>").finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading secret {id}: {why}")]
    Read { id: String, why: String },
    #[error("secret {id} is not JSON with a \"password\" string")]
    Shape { id: String },
}

/// One secret, cached. `generation` counts the reads, so concurrent connections that all
/// saw the same refused login read the secret once between them.
pub struct DbSecret {
    client: aws_sdk_secretsmanager::Client,
    id: String,
    cached: Mutex<Option<(u64, Login)>>,
    reads: AtomicU64,
}

impl std::fmt::Debug for DbSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbSecret").field("id", &self.id).finish_non_exhaustive()
    }
}

impl DbSecret {
    /// `id` is the secret's ARN or name. Reads nothing yet.
    pub fn new(sdk: &aws_config::SdkConfig, id: &str) -> Self {
        Self {
            client: aws_sdk_secretsmanager::Client::new(sdk),
            id: id.to_owned(),
            cached: Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }

    /// How many times the secret was read (a measure, and what the rotation test watches).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The kept login and its generation, reading the secret the first time.
    pub async fn current(&self) -> Result<(u64, Login), SecretError> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        let login = self.read().await?;
        *cached = Some((1, login.clone()));
        Ok((1, login))
    }

    /// Read the secret again after Postgres refused the login of `seen` generation; a newer
    /// login another connection already read is returned as it is.
    pub async fn refresh(&self, seen: u64) -> Result<(u64, Login), SecretError> {
        let mut cached = self.cached.lock().await;
        if let Some((generation, login)) = cached.as_ref()
            && *generation != seen
        {
            return Ok((*generation, login.clone()));
        }
        let login = self.read().await?;
        let next = cached.as_ref().map_or(1, |(g, _)| g + 1);
        *cached = Some((next, login.clone()));
        Ok((next, login))
    }

    async fn read(&self) -> Result<Login, SecretError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let out = self
            .client
            .get_secret_value()
            .secret_id(&self.id)
            .send()
            .await
            .map_err(|e| SecretError::Read { id: self.id.clone(), why: DisplayErrorContext(e).to_string() })?;
        let shape = || SecretError::Shape { id: self.id.clone() };
        let value: serde_json::Value =
            serde_json::from_str(out.secret_string().ok_or_else(shape)?).map_err(|_| shape())?;
        Ok(Login {
            username: value["username"].as_str().map(str::to_owned),
            password: value["password"].as_str().ok_or_else(shape)?.to_owned(),
        })
    }
}
