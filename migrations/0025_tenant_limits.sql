-- Every row a tenant's own call creates is bounded per tenant (`limits`). The defaults are the
-- deployment's configuration; an operator raises (or lowers) one kind for one tenant here,
-- through `PUT /v1/admin/tenants/{tenant_id}/limits` (audited in `admin_actions`). Additive:
-- nothing older reads it.
CREATE TABLE tenant_limits (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind IN ('destinations', 'templates', 'suppressions', 'pending_jobs')),
    max_rows    bigint NOT NULL CHECK (max_rows BETWEEN 0 AND 1000000000),
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, kind)
);

-- A tenant's unfinished jobs in creation order (ids are UUIDv7), counted by intake against its
-- `pending_jobs` limit: those created since its last count are a short range at the right edge
-- of the tenant's part (`limits::Quotas::admit_jobs`).
CREATE INDEX jobs_tenant_open ON jobs (tenant_id, id) WHERE status IN ('pending', 'running', 'waiting');
