//! Relay's integration tests: one binary, real Postgres, one schema per test.

mod support;

mod api;
mod executor;
mod store;
mod sweep;
