-- The status contract's inputs: process liveness, read-only status keys, and indexes that keep
-- the status queries cheap on a table of millions of finished jobs.

-- One row per process or function instance, upserted on a heartbeat every few seconds (never
-- per job). `instance_id` is host:pid:boot for a process, the log stream for a Lambda container.
CREATE TABLE workers (
    instance_id  text PRIMARY KEY CHECK (instance_id <> '' AND length(instance_id) <= 500),
    kind         text NOT NULL CHECK (kind IN ('api', 'worker', 'sweeper', 'executor', 'ingress')),
    host         text NOT NULL,
    pid          integer,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX workers_last_seen ON workers (last_seen_at);

-- Read-only keys for GET /v1/status, distinct from tenant keys: a status key reads the
-- platform's health and nothing else; a tenant key cannot read the status.
CREATE TABLE status_keys (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name <> '' AND length(name) <= 200),
    -- sha256 of the key; the key itself is shown once, at creation.
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz
);

-- Indexes for the status contract. Like every index on `jobs` (see 0001), each one gets its
-- entries at the right edge: a job enters each at most once, when it reaches the state, at
-- now(). Failed jobs by finish time (failure counts); finished top-level jobs by finish time
-- (recent runs, runs per bucket); waiting parents (live rows only, like jobs_due).
CREATE INDEX jobs_failed_finished ON jobs (finished_at) WHERE status = 'failed';
CREATE INDEX jobs_finished_top ON jobs (finished_at) WHERE finished_at IS NOT NULL AND parent_id IS NULL;
CREATE INDEX jobs_waiting ON jobs (updated_at) WHERE status = 'waiting';
