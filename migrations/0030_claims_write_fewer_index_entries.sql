-- A claim writes fewer index entries (issue 34). Every update of a job writes a new entry into
-- each index whose predicate the new row matches (a status change is never HOT), so an index
-- that holds running jobs costs every claim an entry. `jobs_tenant_open` now holds pending and
-- waiting jobs only: intake counts a tenant's running jobs among the running rows
-- (`jobs_leases`, as many as the workers' slots) (`store::limits::open_count`).
DROP INDEX jobs_tenant_open;
CREATE INDEX jobs_tenant_open ON jobs (tenant_id, id) WHERE status IN ('pending', 'waiting');

-- An accepted job writes one entry fewer: `jobs_due` (every pending job by run_at) duplicated
-- `jobs_due_free` and `jobs_keyed_pending`, which hold the same rows split by key; readers of
-- every pending job read both (`store::jobs::PENDING_JOBS`), the sweep's lost dispatches go
-- tenant by tenant along `jobs_due_free`.
DROP INDEX jobs_due;
