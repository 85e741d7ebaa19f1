-- Campaigns (`email.campaign`), and tenants' own sending roles. A large recipient list
-- arrives in pages after the campaign is submitted (`PUT /v1/jobs/{id}/recipients/{page}`);
-- the campaign falls due when its last page lands. A task may continue itself across runs (a campaign creating its children in slices)
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

-- A tenant's own sending role (in its AWS account): `email.send` runs under it, assumed with
-- the external id `relay-<tenant id>` (Relay's, not the tenant's choice), so a routing bug is
-- an access denial, not mail from the wrong domain.
CREATE TABLE tenant_sending_roles (
    tenant_id   uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    role_arn    text NOT NULL CHECK (role_arn LIKE 'arn:aws%:iam::%:role/%'),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
