//! What a running `relay dev` tells the other `relay` commands: its database URL, API URL,
//! console URL and the console's status key, in `relay-dev.json` inside its data dir (written
//! at every start, readable only by its owner). A command that needs a database uses
//! `DATABASE_URL` when set, otherwise this file, and says on stderr which it used.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// `relay dev`'s data dir when `--data-dir` is not given.
pub const DEFAULT_DATA_DIR: &str = ".relay/pg";

const FILE_NAME: &str = "relay-dev.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DevInstance {
    pub database_url: String,
    pub api_url: String,
    #[serde(default)]
    pub console_url: Option<String>,
    /// The status key the console reads `/v1/status` with (kept so a restart reuses it).
    #[serde(default)]
    pub status_key: Option<String>,
    /// The `--local-ses` rate this instance ran with: a start without it forgets the account
    /// reading the local SES gave.
    #[serde(default)]
    pub local_ses: Option<u32>,
}

/// The file in a data dir.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

impl DevInstance {
    /// The file in `data_dir`, if there is one that parses.
    pub fn read(data_dir: &Path) -> Option<DevInstance> {
        serde_json::from_str(&std::fs::read_to_string(path(data_dir)).ok()?).ok()
    }

    pub fn write(&self, data_dir: &Path) -> anyhow::Result<()> {
        let file = path(data_dir);
        std::fs::write(&file, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", file.display()))?;
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        Ok(())
    }

    /// The port of the database URL (what `relay dev` asks for again at its next start).
    pub fn database_port(&self) -> Option<u16> {
        let config: tokio_postgres::Config = self.database_url.parse().ok()?;
        config.get_ports().first().copied()
    }
}

/// The database a command uses: `DATABASE_URL` (or `--database-url`) when given, otherwise
/// the one `relay dev` recorded in `data_dir` (default `.relay/pg`). Says which on stderr.
pub fn database_url(given: Option<String>, data_dir: Option<&Path>) -> anyhow::Result<String> {
    if let Some(url) = given {
        eprintln!("relay: using DATABASE_URL");
        return Ok(url);
    }
    let dir = data_dir.unwrap_or(Path::new(DEFAULT_DATA_DIR));
    match DevInstance::read(dir) {
        Some(dev) => {
            eprintln!("relay: using relay dev's database {} (from {})", dev.database_url, path(dir).display());
            Ok(dev.database_url)
        }
        None => anyhow::bail!(
            "no database: DATABASE_URL is not set and {} does not exist. Start `relay dev` (from this \
             folder, or pass its --data-dir), or set DATABASE_URL",
            path(dir).display()
        ),
    }
}
