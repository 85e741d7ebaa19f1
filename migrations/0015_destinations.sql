-- `http.request`: a tenant's named HTTP destinations, and every call made to one.
--
-- A destination's auth header value is not here: it is a secret in Secrets Manager whose name
-- Relay derives from the tenant and the destination (`relay/tenants/<tenant id>/destinations/
-- <name>`), written through the API and read at run time under the task's own role.

CREATE TABLE http_destinations (
    tenant_id        uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    base_url         text NOT NULL CHECK (base_url ~ '^https?://' AND length(base_url) <= 2000),
    -- The header the secret is sent in (e.g. `Authorization`); NULL: no auth header.
    auth_header      text CHECK (auth_header ~ '^[A-Za-z0-9-]{1,64}$'),
    -- When the secret value was last written through the API (the value is never stored here).
    secret_set_at    timestamptz,
    timeout_ms       integer NOT NULL CHECK (timeout_ms BETWEEN 100 AND 60000),
    rate_per_second  double precision NOT NULL CHECK (rate_per_second > 0 AND rate_per_second <= 1000),
    -- The next moment a call may start: every worker takes its slot here, so the rate holds
    -- across workers.
    next_slot        timestamptz NOT NULL DEFAULT '-infinity',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- One row per call attempt (and per shadowed call), written as `sending` before the request
-- leaves (committed: a later attempt that finds it unsettled knows a call may have gone) and
-- settled with the outcome. The request is kept with the secret redacted.
CREATE TABLE http_calls (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant_id    uuid NOT NULL,
    destination  text NOT NULL,
    attempt      integer NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN
                     ('sending', 'succeeded', 'retryable', 'fatal', 'ambiguous', 'shadowed', 'refused')),
    request      jsonb NOT NULL,
    http_status  integer,
    response     jsonb,
    error        text,
    duration_ms  integer,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX http_calls_job ON http_calls (job_id, id);
CREATE INDEX http_calls_destination ON http_calls (tenant_id, destination, id);

-- A destination's own write switch is an operating mode like the others (audited, read on
-- every claim): `write:http:<tenant id>:<destination>`; no row means on.
ALTER TABLE operating_modes DROP CONSTRAINT operating_modes_name_check;
ALTER TABLE operating_modes ADD CONSTRAINT operating_modes_name_check CHECK (
    name ~ '^(shadow|write:[a-z_]+|pause:[a-z0-9_.]+)$'
    OR name ~ '^write:http:[0-9a-f-]{36}:[a-z0-9][a-z0-9_-]{0,62}$');
