//! The console function: the same console as `relay console`, behind a function URL, with no
//! database and no queue. Its projects come from `RELAY_CONSOLE_PROJECTS` (JSON); the cache
//! lives as long as the container.

use axum::Router;

use crate::{Console, ConsoleConfig};

/// The console router for this configuration.
pub fn router(config: ConsoleConfig) -> anyhow::Result<Router> {
    Ok(crate::router(Console::new(config)?))
}

/// Read `RELAY_CONSOLE_PROJECTS` once per container; the error names the variable.
pub fn router_from_env() -> anyhow::Result<Router> {
    router(ConsoleConfig::from_env()?)
}
