-- A destination's calls as the estate's own code makes them (issue 49):
--
-- * `oauth`: the token is minted at run time by an OAuth 2.0 grant (client credentials, Zoom's
--   account credentials, or a refresh token) at `token_url`, under the same address guard as
--   the destination. The client secret and the refresh token are secrets like the auth
--   secret (Secrets Manager or the local store, never here: only when they were last
--   written); the token itself is held in the worker's memory only, never in a table.
-- * `signature`: how `webhook.send` signs, when not the Standard Webhooks way (NULL).
-- * `success`: which answers succeed (statuses, and a JSON pointer that must hold a value).
--
-- The JSON is checked by the API (`destinations::oauth`, `signature`, `success`); the CHECKs
-- bound its size. Nullable columns without defaults: adding them rewrites nothing.
ALTER TABLE http_destinations
    ADD COLUMN oauth jsonb CHECK (oauth IS NULL OR length(oauth::text) <= 8192),
    ADD COLUMN signature jsonb CHECK (signature IS NULL OR length(signature::text) <= 2048),
    ADD COLUMN success jsonb CHECK (success IS NULL OR length(success::text) <= 4096),
    ADD COLUMN client_secret_set_at timestamptz,
    ADD COLUMN refresh_token_set_at timestamptz;
