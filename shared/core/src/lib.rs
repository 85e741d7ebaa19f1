//! taskdeck: Relay's core, the platform itself. Each Lambda in `functions/` and the `relay`
//! tool only wire configuration, pools and clients, then call into this crate.

// Read top-down: each layer imports only the layers below it.

// Edges: how the outside reaches the platform.
pub mod api;
pub mod lambda;
pub mod platform;
pub mod config;
pub mod client;

// Services: what the platform does with a job.
pub mod intake;
pub mod transport;
pub mod executor;
pub mod sweep;
pub mod completions;
pub mod schedules;
pub mod exceptions;
pub mod alerts;
pub mod callbacks;
pub mod destinations;
pub mod email;
pub mod credentials;
pub mod liveness;
pub mod telemetry;
pub mod metrics;

// The task contract and the task types that implement it.
pub mod task;
pub mod catalogue;

// What a job looks like from outside, built from its rows: the job resource, its progress
// and why it waits.
pub mod view;
pub mod progress;

// Postgres: all SQL.
pub mod store;

// The domain: the job's vocabulary and pure rules, no I/O.
pub mod retry;
pub mod job;
pub mod plain;
