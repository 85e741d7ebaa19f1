-- Per-key concurrency, declared fan-out totals, run-time baselines, and signed callbacks.

-- A job may carry a concurrency key with a limit: no more than `concurrency_limit` jobs of
-- one key run at once. A fan-out parent declares how many children it will have before it
-- creates them, so its progress never counts against a moving total. A job may name its own
-- callback URL (otherwise its tenant's applies). Nullable columns with no default: adding
-- them rewrites nothing.
ALTER TABLE jobs
    ADD COLUMN concurrency_key   text CHECK (concurrency_key <> '' AND length(concurrency_key) <= 200),
    ADD COLUMN concurrency_limit integer CHECK (concurrency_limit BETWEEN 1 AND 10000),
    ADD COLUMN children_total    integer CHECK (children_total >= 0),
    ADD COLUMN callback_url      text CHECK (length(callback_url) <= 2000),
    ADD CONSTRAINT jobs_key_has_limit CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL));

-- The claim's two paths (see store/jobs.rs). Jobs without a key are claimed from their own
-- partial index, so keyed jobs waiting for a slot never lie in their way; keyed jobs are
-- found key by key (due ones, and how many of each key run). Keyed rows have no entry in
-- `jobs_due_free`, unkeyed rows none in the two keyed indexes.
CREATE INDEX jobs_due_free ON jobs (run_at) WHERE status = 'pending' AND concurrency_key IS NULL;
CREATE INDEX jobs_keyed_pending ON jobs (concurrency_key, run_at)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_keyed_running ON jobs (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- The rolling baseline of each task type's run time: median and p95 of its latest successful
-- top-level runs, refreshed by the sweep (never on the hot path).
CREATE TABLE task_baselines (
    task_type  text PRIMARY KEY,
    p50_s      double precision NOT NULL,
    p95_s      double precision NOT NULL,
    runs       integer NOT NULL CHECK (runs > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A tenant's callback endpoint and its signing secrets. During a rotation the previous secret
-- still signs (each delivery carries a signature per valid secret) until `previous_until`.
-- No URL: only jobs that name their own `callback_url` get callbacks.
CREATE TABLE tenant_callbacks (
    tenant_id        uuid PRIMARY KEY REFERENCES tenants (id),
    url              text CHECK (url <> '' AND length(url) <= 2000),
    secret           text NOT NULL,
    previous_secret  text,
    previous_until   timestamptz,
    secret_created_at timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenant_callbacks_previous_has_end CHECK ((previous_secret IS NULL) = (previous_until IS NULL))
);

-- Every delivery attempt of a callback, whatever came of it. `job_id` is the job the callback
-- reports on (the tenant's), `delivery_job_id` the platform job that delivers it.
CREATE TABLE callback_attempts (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          uuid NOT NULL,
    tenant_id       uuid NOT NULL,
    delivery_job_id uuid NOT NULL,
    attempt         integer NOT NULL,
    event           text NOT NULL,
    url             text NOT NULL,
    outcome         text NOT NULL CHECK (outcome IN ('delivered', 'failed', 'refused', 'shadowed', 'gone', 'skipped')),
    http_status     integer,
    error           text,
    duration_ms     integer,
    at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX callback_attempts_job ON callback_attempts (job_id, id);

-- A UUIDv7 made in SQL, for jobs created inside a statement (callback deliveries), so their ids
-- stay time-ordered like every other job's.
CREATE FUNCTION relay_uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
               PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
               FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

-- Callback deliveries are platform jobs: the platform tenant must exist for the statements
-- that create them. Its key is random and never shown.
INSERT INTO tenants (id, name, api_key_hash)
VALUES (relay_uuid_v7(), 'platform', sha256(convert_to(gen_random_uuid()::text, 'UTF8')))
ON CONFLICT (name) DO NOTHING;
