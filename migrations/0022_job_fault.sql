-- Whose failure a failed job is, shown on the job and its callback: 'tenant' (its own
-- endpoint, input, sender, template data or completion; counted in `tenant_faults`, no
-- operator exception) or 'platform' (an exception opened). NULL until the job fails.
ALTER TABLE jobs ADD COLUMN fault text CHECK (fault IN ('tenant', 'platform'));
