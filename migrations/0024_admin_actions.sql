-- The audit of the admin function (`aws lambda invoke` of <stack>-admin): one row per
-- invocation, whatever its outcome. `actor` is who the caller says they are; the caller's IAM
-- identity is in CloudTrail's Lambda Invoke event, joined by the request id. Keys created are
-- never recorded. Additive: nothing older reads it.
CREATE TABLE admin_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action      text NOT NULL CHECK (action <> '' AND length(action) <= 100),
    actor       text NOT NULL CHECK (actor <> '' AND length(actor) <= 200),
    request_id  text CHECK (length(request_id) <= 200),
    ok          boolean NOT NULL,
    -- What was asked and what came of it (names, counts, the error's code); never a key.
    detail      jsonb NOT NULL DEFAULT '{}',
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_actions_at ON admin_actions (at);
