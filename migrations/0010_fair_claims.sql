-- Fair claiming across tenants: the due unkeyed jobs are indexed per tenant, so one claim can
-- find every tenant with due work and take each one's oldest jobs in turn (`store::jobs::claim_due`).
-- This replaces the run_at-only index of 0007; nothing else read it.
DROP INDEX jobs_due_free;
CREATE INDEX jobs_due_free ON jobs (tenant_id, run_at) WHERE status = 'pending' AND concurrency_key IS NULL;
