-- Campaigns (`email.campaign`). A large recipient list arrives in pages after the campaign is
-- submitted (`PUT /v1/jobs/{id}/recipients/{page}`); the campaign falls due when its last page
-- lands. A task may continue itself across runs (a campaign creating its children in slices)
-- and a parent starts waiting for its children: both are job events of their own.

CREATE TABLE campaign_pages (
    job_id      uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    page        integer NOT NULL CHECK (page >= 0),
    recipients  jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, page)
);

-- The new list holds every old kind, so no existing row can violate it.
ALTER TABLE job_events DROP CONSTRAINT job_events_kind_check;
ALTER TABLE job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'succeeded', 'retry_scheduled', 'failed', 'cancelled',
    'lease_expired', 'redispatched', 'stale_write_refused',
    'operator_retry', 'force_finished', 'exception_ignored',
    'continued', 'waiting')) NOT VALID;
