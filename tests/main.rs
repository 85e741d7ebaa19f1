//! Relay's integration tests: one binary, real Postgres (one schema per test), AWS paths
//! through moto's server mode (started by the harness).

mod support;

mod admin;
mod api;
mod callbacks;
mod campaign;
mod chaos;
mod cli;
mod completions;
mod conformance;
mod console;
mod credentials;
mod dbconn;
mod deploy;
mod dev;
mod email;
mod executor;
mod flow;
mod functions;
mod hostile;
mod http;
mod lambda;
mod operations;
mod python;
mod schedules;
mod status;
mod store;
mod sweep;
mod template;
