-- Jobs that run after other jobs (`after` at submit, same tenant). A dependent whose
-- dependencies have not all succeeded is pending, held out of the claim with its `run_at` far
-- ahead (as a held campaign is), and its hold keeps the time it asked for. When a dependency
-- ends, the write that ends it sees `has_dependents` on its own row and releases (or cancels)
-- its dependents; a job no other job runs after carries NULL there and pays nothing more.

-- Set (under the dependency's row lock) by the submit of a job that runs after this one.
ALTER TABLE jobs ADD COLUMN has_dependents boolean;

-- A dependent still held: when it is due once released, and how many of its dependencies have
-- not ended yet. Deleted by the sweep once the job is released or ended.
CREATE TABLE job_holds (
    job_id     uuid PRIMARY KEY,
    tenant_id  uuid NOT NULL,
    run_at     timestamptz NOT NULL,
    waiting    integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The dependencies not yet resolved: one row per (dependency, dependent), deleted by the
-- statement that resolves it. Only live dependencies are stored (one that had succeeded at
-- submit needs no row), so the sweep's pass over them is proportional to what is held.
CREATE TABLE job_dependencies (
    after_id uuid NOT NULL,
    job_id   uuid NOT NULL,
    PRIMARY KEY (after_id, job_id)
);
