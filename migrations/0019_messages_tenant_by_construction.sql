-- A message's tenant is its job's tenant by construction: the one statement that inserts
-- messages (`store::messages`, the intent of `email.send`) reads `tenant_id` and `job_id` from
-- the running job it is fenced on, whose own foreign key to `tenants` was checked when it was
-- inserted. The messages' foreign key checked the same tenant again on every message, an
-- index probe and a row lock (shared by every concurrent send of the tenant, a multixact) per
-- message. `tests/store.rs` proves the invariant.
ALTER TABLE messages DROP CONSTRAINT messages_tenant_id_fkey;
