-- Email cut over in stages (`email::cutover`), per tenant and task type (`email.send`, or
-- `email.campaign` for a campaign's children): `shadow` (recorded, not sent), `share` (live for
-- the recipients whose address hashes into `share`, the rest shadowed), `live`. No row: the
-- global modes alone decide, as before. A `share` stage halts back to `shadow` by itself
-- (`halted_at`, `halted_reason`) when the tenant's rates over its sends since `started_at`
-- cross the stage's thresholds. Changes are audited in `admin_actions`. Additive.
CREATE TABLE cutover_stages (
    tenant_id       uuid NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    task_type       text NOT NULL CHECK (task_type IN ('email.send', 'email.campaign')),
    stage           text NOT NULL CHECK (stage IN ('shadow', 'share', 'live')),
    share           double precision NOT NULL CHECK (share >= 0 AND share <= 1),
    halt_bounce     double precision NOT NULL CHECK (halt_bounce > 0 AND halt_bounce <= 1),
    halt_complaint  double precision NOT NULL CHECK (halt_complaint > 0 AND halt_complaint <= 1),
    halt_failure    double precision NOT NULL CHECK (halt_failure > 0 AND halt_failure <= 1),
    min_sends       bigint NOT NULL CHECK (min_sends BETWEEN 1 AND 1000000),
    started_at      timestamptz NOT NULL DEFAULT now(),
    halted_at       timestamptz,
    halted_reason   text,
    updated_by      text NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, task_type)
);
