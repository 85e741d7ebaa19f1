//! taskdeck: Relay's core, the platform itself. Each Lambda in `functions/` and the `relay`
//! tool only wire configuration, pools and clients, then call into this crate.

// Read top-down: each layer imports only the layers below it.

// Edges: how the outside reaches the platform.
pub mod api;
pub mod client;
pub mod config;
pub mod lambda;
pub mod platform;

// Services: what the platform does with a job.
pub mod alerts;
pub mod callbacks;
pub mod completions;
pub mod credentials;
pub mod destinations;
pub mod email;
pub mod exceptions;
pub mod executor;
pub mod intake;
pub mod liveness;
pub mod metrics;
pub mod outbound;
pub mod parents;
pub mod provider;
pub mod schedules;
pub mod sweep;
pub mod telemetry;
pub mod transport;

// The task contract and the task types that implement it.
pub mod catalogue;
pub mod task;

// What a job looks like from outside, built from its rows: the job resource, its progress
// and why it waits.
pub mod progress;
pub mod view;

// Postgres: all SQL.
pub mod store;

// The domain: the job's vocabulary and pure rules, no I/O.
pub mod job;
pub mod plain;
pub mod retry;
