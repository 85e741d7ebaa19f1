-- Operations: operator keys, the audit of every action on an exception, platform-owned cron
-- schedules, and the job event kinds operator actions record.

-- Operators authenticate with their own keys, never with a tenant's. The name is the "who"
-- of every audit row an operator's action writes.
CREATE TABLE operator_keys (
    id           uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_.@:-]{1,100}$'),
    -- sha256 of the key; the key is shown once, at creation.
    key_hash     bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    disabled_at  timestamptz
);

-- Every action on an exception: who, when, what, why. The system's own resolutions too (who
-- = 'system'). No foreign keys: the audit outlives the job when retention deletes it.
CREATE TABLE exception_actions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    exception_id  uuid NOT NULL,
    job_id        uuid NOT NULL,
    action        text NOT NULL CHECK (action IN ('retry', 'cancel', 'finish', 'ignore', 'resolve')),
    actor         text NOT NULL CHECK (actor <> ''),
    reason        text,
    -- Action details (e.g. the time of a retry).
    detail        jsonb,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX exception_actions_exception ON exception_actions (exception_id, id);

-- Exceptions are listed newest first, open or not.
CREATE INDEX exceptions_opened ON exceptions (opened_at, id);

-- Operator actions record job events of their own. The new list holds every old kind, so no
-- existing row can violate it (NOT VALID skips a scan of the table that proves only that).
ALTER TABLE job_events DROP CONSTRAINT job_events_kind_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'succeeded', 'retry_scheduled', 'failed', 'cancelled',
    'lease_expired', 'redispatched', 'stale_write_refused',
    'operator_retry', 'force_finished', 'exception_ignored')) NOT VALID;

-- Platform-owned cron schedules. The sweep fires each due slot once: the slot is part of the
-- job's idempotency key (`schedule:<id>:<slot>`), and advancing `last_fired_slot` under
-- FOR UPDATE SKIP LOCKED keeps several sweepers from firing it twice.
CREATE TABLE schedules (
    id               uuid PRIMARY KEY,
    name             text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    task_type        text NOT NULL,
    params           jsonb NOT NULL,
    cron             text NOT NULL CHECK (cron <> '' AND length(cron) <= 200),
    timezone         text NOT NULL CHECK (timezone <> ''),
    enabled          boolean NOT NULL DEFAULT true,
    -- Fire every missed slot after downtime (true) or only the latest one (false).
    catch_up         boolean NOT NULL DEFAULT false,
    last_fired_slot  timestamptz,
    last_job_id      uuid,
    next_run_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    updated_by       text NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_run_at) WHERE enabled;
