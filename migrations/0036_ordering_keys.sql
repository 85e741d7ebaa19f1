-- FIFO per ordering key (issue 49): jobs submitted with one `ordering_key` start in submission
-- order, one at a time. Each such job runs after the key's previous job through the
-- dependencies of migration 0029 (one edge to the job ahead); this table keeps, per tenant and
-- key, the last job submitted (the one a new job queues behind), locked by each submit so
-- submissions of one key are ordered by the lock.
CREATE TABLE ordering_tails (
    tenant_id  uuid NOT NULL,
    key        text NOT NULL,
    -- NULL only between a key's first submit's two statements (the row is created to be locked).
    job_id     uuid,
    -- What the tail job's failure does to the jobs queued behind it.
    on_failure text NOT NULL DEFAULT 'hold' CHECK (on_failure IN ('hold', 'cancel')),
    PRIMARY KEY (tenant_id, key)
);
-- Retention deletes a key's row with its last job.
CREATE INDEX ordering_tails_job ON ordering_tails (job_id);

-- An edge to the job ahead on an ordering key says what that job's failure does: `hold` keeps
-- the edge (the dependent waits until the failed job is retried and succeeds, finished by an
-- operator, or cancelled), `cancel` resolves it as `after` does. NULL: an `after` edge.
ALTER TABLE job_dependencies ADD COLUMN on_failure text CHECK (on_failure IN ('hold', 'cancel'));
-- The job ahead of a held job, for its `waiting_reason` (ordered edges only).
CREATE INDEX job_dependencies_ordered ON job_dependencies (job_id) WHERE on_failure IS NOT NULL;
