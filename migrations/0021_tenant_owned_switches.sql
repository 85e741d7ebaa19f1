-- One tenant cannot slow or override anyone else: a destination's own write switch lives on
-- the destination (removed with it), not in the global `operating_modes` table that every
-- claim reads. An operator's switch for one destination (`write:http:<tenant id>:<name>`)
-- stays in `operating_modes`, apart from the tenant's: it outlives the destination (a tenant
-- cannot clear it by deleting and re-creating one), and work goes out only when both allow it.

ALTER TABLE http_destinations
    ADD COLUMN writes_enabled    boolean NOT NULL DEFAULT true,
    ADD COLUMN writes_reason     text CHECK (length(writes_reason) <= 500),
    ADD COLUMN writes_changed_at timestamptz;

-- The switches tenants set through the API move onto their destinations; those of deleted
-- destinations go.
UPDATE http_destinations d
SET writes_enabled = m.enabled, writes_changed_at = m.updated_at
FROM operating_modes m
WHERE m.name = 'write:http:' || d.tenant_id || ':' || d.name AND m.updated_by = 'tenant:' || d.tenant_id;
DELETE FROM operating_modes WHERE name LIKE 'write:http:%:%' AND updated_by LIKE 'tenant:%';

-- The claim reads only the switches that apply to every job (shadow, the integrations'
-- write switches, the pauses): a handful of rows, whatever the number of per-destination ones.
CREATE INDEX operating_modes_pauses ON operating_modes (name) INCLUDE (enabled) WHERE name LIKE 'pause:%';
CREATE INDEX operating_modes_global ON operating_modes (name) INCLUDE (enabled) WHERE name NOT LIKE 'write:http:%';
