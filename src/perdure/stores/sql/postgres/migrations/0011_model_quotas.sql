-- perdure PostgreSQL schema, version 11: model quotas (perdure.core.quotas). model_quotas
-- holds each provider and model's declared tokens and requests per minute and what 429s
-- taught (the rate's factor, no grant before blocked_until). Its row is locked by each
-- reservation, so reservations of one quota from many nodes take turns.
-- quota_reservations holds the calls in each quota's window: an estimate until
-- settled, then what the provider reported. A settled reservation leaves the window
-- window_seconds after its reply, one in flight once that time passed and its object's
-- lease lapsed, so a dead worker's never leaks.
CREATE TABLE model_quotas (
    provider            TEXT NOT NULL,
    model               TEXT NOT NULL,
    tokens_per_minute   BIGINT,
    requests_per_minute BIGINT,
    window_seconds      DOUBLE PRECISION NOT NULL,
    factor              DOUBLE PRECISION NOT NULL DEFAULT 1.0,
    adapted_at          DOUBLE PRECISION,
    blocked_until       DOUBLE PRECISION,
    throttles           INTEGER NOT NULL DEFAULT 0,
    throttled_at        DOUBLE PRECISION,
    updated_at          DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (provider, model)
);
CREATE TABLE quota_reservations (
    ticket   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    provider TEXT NOT NULL,
    model    TEXT NOT NULL,
    object_id TEXT NOT NULL,
    holder   TEXT NOT NULL,
    tokens   BIGINT NOT NULL,
    at       DOUBLE PRECISION NOT NULL,
    settled  BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX quota_reservations_window ON quota_reservations (provider, model, at);
