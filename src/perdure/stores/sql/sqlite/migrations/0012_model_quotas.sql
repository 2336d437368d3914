-- perdure SQLite schema, version 12: model quotas (perdure.core.quotas). model_quotas
-- holds each provider and model's declared tokens and requests per minute and what 429s
-- taught (the rate's factor, no grant before blocked_until), and quota_reservations holds
-- the calls in each quota's window: an estimate until settled, then what the provider
-- reported. A settled reservation leaves the window window_seconds after its reply, one
-- in flight once that time passed and its object's lease lapsed, so a dead worker's
-- never leaks. Reservations are made under the write lock.
CREATE TABLE model_quotas (
    provider            TEXT NOT NULL,
    model               TEXT NOT NULL,
    tokens_per_minute   INTEGER,
    requests_per_minute INTEGER,
    window_seconds      REAL NOT NULL,
    factor              REAL NOT NULL DEFAULT 1.0,
    adapted_at          REAL,
    blocked_until       REAL,
    throttles           INTEGER NOT NULL DEFAULT 0,
    throttled_at        REAL,
    updated_at          REAL NOT NULL,
    PRIMARY KEY (provider, model)
);
CREATE TABLE quota_reservations (
    ticket   INTEGER PRIMARY KEY AUTOINCREMENT,
    provider TEXT NOT NULL,
    model    TEXT NOT NULL,
    object_id TEXT NOT NULL,
    holder   TEXT NOT NULL,
    tokens   INTEGER NOT NULL,
    at       REAL NOT NULL,
    settled  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX quota_reservations_window ON quota_reservations (provider, model, at);
