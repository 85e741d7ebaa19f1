-- A tenant's own failures (a callback URL the guard refuses, an endpoint that never answers)
-- are not operator exceptions, one per job: each fails its job with the reason on the job and
-- its callback attempts, and counts here, one row per tenant and cause. The sweep signals
-- operators about a row at most once an hour, and only when it grew since the last signal.
CREATE TABLE tenant_faults (
    tenant_id     uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    task_type     text NOT NULL,
    kind          text NOT NULL,
    count         bigint NOT NULL,
    last_error    text NOT NULL,
    last_job_id   uuid NOT NULL,
    first_at      timestamptz NOT NULL DEFAULT now(),
    last_at       timestamptz NOT NULL DEFAULT now(),
    signalled_at  timestamptz,
    PRIMARY KEY (tenant_id, task_type, kind)
);
