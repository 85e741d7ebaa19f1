//! Relay's integration tests: one binary, real Postgres (one schema per test), AWS paths
//! through moto's server mode (started by the harness).

// Test code may unwrap: a failed unwrap is a failed test, said where it fails. (Unit tests
// inside the crates get the same through `allow-unwrap-in-tests` in clippy.toml.)
#![allow(clippy::unwrap_used)]

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
mod cutover;
mod dbconn;
mod dependencies;
mod deploy;
mod deploy_walk;
mod dev;
mod email;
mod email_parts;
mod email_template;
mod executor;
mod fair_lanes;
mod fair_shares;
mod flow;
mod functions;
mod hostile;
mod http;
mod http_leaks;
mod http_oauth;
mod http_rules;
mod lambda;
mod layering;
mod limits;
mod lint;
mod local_secrets;
mod message_events;
mod operations;
mod ordering;
mod pace;
mod policies;
mod python;
mod reputation;
mod schedules;
mod status;
mod store;
mod sweep;
mod template;
mod template_alarms;
mod template_roles;
mod tenancy;
mod topics;
mod webhooks;
mod xray;
