//! taskdeck: Relay's core, the platform itself. Each Lambda in `functions/` and the `relay`
//! tool only wire configuration, pools and clients, then call into this crate.

// Read top-down: each layer imports only the layers below it (and, within a layer, a module
// may use another that does not use it back: no two modules import each other; tests/layering.rs
// fails on a circle).

// Edges: how the outside reaches the platform.
pub mod api;
pub mod client;
pub mod config;
pub mod lambda;
pub mod platform;
pub mod smoke;

// Services that run the platform: they hold the catalogue, or create and move jobs.
pub mod alerts;
pub mod credentials;
pub mod executor;
pub mod intake;
pub mod limits;
pub mod liveness;
pub mod maintenance;
pub mod schedules;

// The registry of task types, one floor above the features that implement them.
pub mod catalogue;

// Features: what the platform does for a job. Each that is a task type holds its adapter
// beside it (`email::task`, `callbacks::task`, `destinations::task`; `provider` is one).
pub mod callbacks;
pub mod completions;
pub mod destinations;
pub mod email;
pub mod exceptions;
pub mod outbound;
pub mod parents;
pub mod provider;
// The job resource: above email (a campaign's quota warning), below the features that send it.
pub mod view;

// The task contract: a leaf above the store; what a task may do beyond its rows it is given
// as capabilities (`task::Jobs`, `task::AwsAccess`), which the services implement.
pub mod task;

// The dispatch seam and process-wide signals.
pub mod metrics;
pub mod telemetry;
pub mod transport;

// What a job looks like from outside, built from its rows: its progress and why it waits.
pub mod progress;

// Postgres: all SQL.
pub mod store;

// The domain: the job's vocabulary and pure rules, no I/O.
pub mod job;
pub mod pattern;
pub mod plain;
pub mod retry;
