//! Relay's integration tests: one binary, real Postgres (one schema per test), AWS paths
//! through moto's server mode (started by the harness).

mod support;

mod api;
mod executor;
mod operations;
mod schedules;
mod store;
mod sweep;
mod conformance;
mod credentials;
mod lambda;
mod functions;
mod template;
mod status;
mod console;
mod email;
mod cli;
mod dev;
mod campaign;
mod flow;
mod callbacks;
mod http;
mod completions;
mod chaos;
mod hostile;
mod python;
mod dbconn;
