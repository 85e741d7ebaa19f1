//! Relay's integration tests: one binary, real Postgres (one schema per test), AWS paths
//! through moto's server mode (started by the harness).

mod support;

mod api;
mod executor;
mod store;
mod sweep;
mod conformance;
mod lambda;
mod template;
mod status;
mod console;
