-- A tenant's sending reputation guard (`email::reputation`): the operator's thresholds (rates as
-- fractions of the sends in the window), the sends exempt from a pause (by message tag), and the
-- guard's state. No row: the defaults in code hold and the state is `ok`. Additive.
CREATE TABLE tenant_reputation (
    tenant_id        uuid PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    warn_bounce      double precision NOT NULL CHECK (warn_bounce > 0 AND warn_bounce <= 1),
    warn_complaint   double precision NOT NULL CHECK (warn_complaint > 0 AND warn_complaint <= 1),
    pause_bounce     double precision NOT NULL CHECK (pause_bounce >= warn_bounce AND pause_bounce <= 1),
    pause_complaint  double precision NOT NULL CHECK (pause_complaint >= warn_complaint AND pause_complaint <= 1),
    window_hours     integer NOT NULL CHECK (window_hours BETWEEN 1 AND 720),
    min_sends        bigint NOT NULL CHECK (min_sends BETWEEN 1 AND 1000000),
    -- `name=value` message tags whose sends a pause does not hold (transactional mail).
    exempt_tags      text[] NOT NULL DEFAULT '{}',
    -- ok | warning | paused: raised by the guard as events arrive, back to ok by an operator.
    state            text NOT NULL DEFAULT 'ok' CHECK (state IN ('ok', 'warning', 'paused')),
    state_reason     text,
    state_since      timestamptz,
    updated_by       text NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Rolling counts read a tenant's recent messages along `messages_recent`; the events of each
-- along `message_events_message`.
