-- A key row's tenant is its job's tenant by construction: both rows are inserted by one
-- statement from one input row (`store::jobs::insert_many`; callback deliveries in
-- `store::callbacks::enqueue_ctes`, for the platform tenant read from `tenants` in that very
-- statement), and a key row exists only where its job was inserted (the job is inserted for
-- the keys the statement took). The job's own foreign key to `tenants` is checked, and a
-- statement whose job fails that check leaves no key row. The key's foreign key checked the
-- same tenant a second time, an index probe and a row lock on the tenant per accepted job.
-- `tests/store.rs` proves the invariant on every insert path.
ALTER TABLE job_keys DROP CONSTRAINT job_keys_tenant_id_fkey;
