//! The console's configuration: the projects it watches, from a JSON file or an environment
//! variable. No database: the console holds only a cache of what it polled.

use std::time::Duration;

use serde::Deserialize;

/// One project the console polls: its status URL (a `relay.status/v1` document) and the
/// bearer token that reads it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Project {
    pub name: String,
    pub status_url: String,
    #[serde(default)]
    pub token: Option<String>,
}

/// `{"projects": [...], "timeout_seconds"?, "refresh_seconds"?}` or just the array.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsoleConfig {
    pub projects: Vec<Project>,
    /// How long one poll of one project may take before it counts as unreachable.
    pub timeout: Duration,
    /// How often the page reloads itself, and the least time between two polls of the set.
    pub refresh: Duration,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum File {
    Full {
        projects: Vec<Project>,
        #[serde(default)]
        timeout_seconds: Option<u64>,
        #[serde(default)]
        refresh_seconds: Option<u64>,
    },
    List(Vec<Project>),
}

/// The variable the console Lambda reads its configuration from.
pub const ENV_VAR: &str = "RELAY_CONSOLE_PROJECTS";

impl ConsoleConfig {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
    pub const DEFAULT_REFRESH: Duration = Duration::from_secs(15);

    /// Parse a configuration; `source` names where it came from in the error.
    pub fn parse(text: &str, source: &str) -> anyhow::Result<ConsoleConfig> {
        let file: File = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("{source}: not a console configuration ({e}); expected {{\"projects\": [{{\"name\", \"status_url\", \"token\"}}]}}"))?;
        let (projects, timeout, refresh) = match file {
            File::Full { projects, timeout_seconds, refresh_seconds } => (projects, timeout_seconds, refresh_seconds),
            File::List(projects) => (projects, None, None),
        };
        for p in &projects {
            if p.name.trim().is_empty() {
                anyhow::bail!("{source}: a project has an empty name");
            }
            if !(p.status_url.starts_with("http://") || p.status_url.starts_with("https://")) {
                anyhow::bail!("{source}: project {:?}: status_url must be an http(s) URL", p.name);
            }
        }
        let secs = |v: Option<u64>, d: Duration| v.map_or(d, |s| Duration::from_secs(s.clamp(1, 300)));
        Ok(ConsoleConfig {
            projects,
            timeout: secs(timeout, Self::DEFAULT_TIMEOUT),
            refresh: secs(refresh, Self::DEFAULT_REFRESH),
        })
    }

    /// Give projects their tokens from a JSON object `{"<project name>": "<token>"}` (the
    /// console function reads it from Secrets Manager, `RELAY_CONSOLE_TOKENS_SECRET`, so no
    /// token sits in its environment). A name no project has is an error, naming `source`.
    pub fn with_tokens(mut self, text: &str, source: &str) -> anyhow::Result<ConsoleConfig> {
        let tokens: std::collections::BTreeMap<String, String> = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("{source}: not a JSON object of project name to token ({e})"))?;
        for (name, token) in tokens {
            let Some(p) = self.projects.iter_mut().find(|p| p.name == name) else {
                anyhow::bail!("{source}: a token for {name:?}, which is not a project");
            };
            p.token = Some(token);
        }
        Ok(self)
    }

    pub fn from_file(path: &std::path::Path) -> anyhow::Result<ConsoleConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// From `RELAY_CONSOLE_PROJECTS` (the JSON itself); the error names the variable.
    pub fn from_env() -> anyhow::Result<ConsoleConfig> {
        let text = std::env::var(ENV_VAR).map_err(|_| anyhow::anyhow!("{ENV_VAR} is not set"))?;
        Self::parse(&text, ENV_VAR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_parse_and_bad_ones_name_the_source() {
        let c =
            ConsoleConfig::parse(r#"[{"name": "relay", "status_url": "http://x/v1/status", "token": "rs_1"}]"#, "f")
                .unwrap();
        assert_eq!(c.projects[0].token.as_deref(), Some("rs_1"));
        let c = c.with_tokens(r#"{"relay": "rs_from_secret"}"#, "secret").unwrap();
        assert_eq!(c.projects[0].token.as_deref(), Some("rs_from_secret"));
        let e = c.clone().with_tokens(r#"{"other": "x"}"#, "secret").unwrap_err().to_string();
        assert!(e.starts_with("secret: a token for \"other\""), "{e}");
        assert!(c.clone().with_tokens("[]", "secret").is_err());
        assert_eq!(c.timeout, ConsoleConfig::DEFAULT_TIMEOUT);
        let c = ConsoleConfig::parse(r#"{"projects": [], "timeout_seconds": 2}"#, "f").unwrap();
        assert_eq!(c.timeout, Duration::from_secs(2));
        let e =
            ConsoleConfig::parse(r#"[{"name": "a", "status_url": "ftp://x"}]"#, "RELAY_CONSOLE_PROJECTS").unwrap_err();
        assert!(e.to_string().starts_with("RELAY_CONSOLE_PROJECTS: project \"a\""), "{e}");
        assert!(ConsoleConfig::parse("{", "f").is_err());
    }
}
