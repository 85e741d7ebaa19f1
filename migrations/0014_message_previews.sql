-- A shadowed message keeps exactly what would have been sent (from, recipients, subject,
-- bodies, headers, tags), so shadow mode can be previewed (`GET /v1/messages/{id}`).
-- Messages really sent keep only their subject and recipients, as before.
ALTER TABLE messages ADD COLUMN preview jsonb;
