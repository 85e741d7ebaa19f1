-- SES tenants Relay set up (`email::ses_tenants`, under `write:ses_tenants`): per Relay tenant,
-- each part of its SES tenant known to exist at SES: `tenant` (the SES tenant itself,
-- `CreateTenant`), `identity:<identity>` and `configuration_set:<name>` (associated with it,
-- `CreateTenantResourceAssociation`). A send whose parts are all here makes no call; a part
-- missing (a new identity, another configuration set) is set up before the send. Additive.
CREATE TABLE ses_tenant_resources (
    tenant_id   uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    resource    text NOT NULL CHECK (resource = 'tenant' OR resource LIKE 'identity:%' OR resource LIKE 'configuration_set:%'),
    ses_tenant  text NOT NULL,
    -- The ARN associated (null for `tenant`).
    resource_arn text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, resource)
);
