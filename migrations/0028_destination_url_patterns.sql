-- Signed outbound webhooks (issue 35): a destination may allow run-time URLs by pattern
-- (`webhook.send`), and holds a Standard Webhooks signing secret beside its auth secret (the
-- value in Secrets Manager or the local store, never here: only when it was last written).
-- Constant defaults: adding the columns rewrites nothing.
ALTER TABLE http_destinations
    ADD COLUMN url_patterns text[] NOT NULL DEFAULT '{}',
    ADD COLUMN signing_secret_set_at timestamptz;
