-- perdure PostgreSQL schema: what applying every file in migrations/ yields.
-- version: 12
-- Checked by tests/migration: when a migration changes the schema, update this file.

-- Written by the store itself before the first migration runs: one row per applied file.
CREATE TABLE perdure_migrations (
    version     INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY,
    public_key  BYTEA NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    serves       TEXT[] NOT NULL DEFAULT '{}',
    capabilities TEXT[] NOT NULL DEFAULT '{}',
    seen_at      DOUBLE PRECISION,
    live_until   DOUBLE PRECISION
);

CREATE TABLE objects (
    object_id        TEXT PRIMARY KEY,
    agent            TEXT NOT NULL,
    agent_version    TEXT NOT NULL,
    status           TEXT NOT NULL,
    phase            TEXT NOT NULL,
    epoch            BIGINT NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires    DOUBLE PRECISION,
    ready_at         DOUBLE PRECISION,
    waiting_event    TEXT,
    paused           BOOLEAN NOT NULL DEFAULT FALSE,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    parked           BOOLEAN NOT NULL DEFAULT FALSE,
    note             TEXT,
    head_seq         BIGINT NOT NULL,
    head_hash        BYTEA NOT NULL,
    result           BYTEA,
    parent_id        TEXT,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    requires         TEXT[] NOT NULL DEFAULT '{}',
    avoid            TEXT[] NOT NULL DEFAULT '{}',
    crashes          INTEGER NOT NULL DEFAULT 0,
    crash_seq        BIGINT,
    queue            TEXT,
    queue_key        TEXT,
    priority         INTEGER NOT NULL DEFAULT 0,
    started_at       DOUBLE PRECISION,
    dedupe_key       TEXT
);

-- Runnable objects by ready time, and by due time (the ready time, or the lease expiry if
-- later): an idle or claiming node reads only what is due or held, however many sleep.
CREATE INDEX objects_ready ON objects ((ready_at + 0))
WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested) AND queue IS NULL;
CREATE INDEX objects_due ON objects ((GREATEST(ready_at, COALESCE(lease_expires, ready_at))))
WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_status ON objects (status, created_at);
CREATE INDEX objects_agent ON objects (agent, created_at);
CREATE INDEX objects_lease_owner ON objects (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX objects_parent ON objects (parent_id, created_at) WHERE parent_id IS NOT NULL;
CREATE INDEX objects_created ON objects (created_at, object_id);
CREATE INDEX objects_queued ON objects (queue, priority, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_queue_ready ON objects (queue, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);
CREATE INDEX objects_queue_held ON objects (queue, queue_key)
WHERE queue IS NOT NULL AND lease_owner IS NOT NULL;
CREATE INDEX objects_queue_starts ON objects (queue, started_at)
WHERE queue IS NOT NULL AND started_at IS NOT NULL;
CREATE UNIQUE INDEX objects_dedupe ON objects (queue, dedupe_key)
WHERE dedupe_key IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');

-- Named queues and their limits (perdure.core.flow); a claim locks its queue's row
-- while it counts the queue's slots.
CREATE TABLE queues (
    name               TEXT PRIMARY KEY,
    concurrency        INTEGER,
    per_key            INTEGER,
    worker_concurrency INTEGER,
    rate_limit         INTEGER,
    rate_period        DOUBLE PRECISION,
    priority           BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at         DOUBLE PRECISION NOT NULL
);

CREATE TABLE records (
    object_id   TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    trace_id    TEXT NOT NULL,
    ts_us       BIGINT NOT NULL,
    node_id     TEXT NOT NULL,
    policy_ref  TEXT NOT NULL,
    kind        TEXT NOT NULL,
    body        BYTEA NOT NULL,
    prev_hash   BYTEA NOT NULL,
    hash        BYTEA NOT NULL,
    signature   BYTEA NOT NULL,
    PRIMARY KEY (object_id, seq)
);

-- One signature over every record a node wrote in one commit; a sealed record holds
-- b"S" + digest in its signature column.
CREATE TABLE seals (
    digest    BYTEA PRIMARY KEY,
    node_id   TEXT NOT NULL,
    hashes    BYTEA NOT NULL,
    signature BYTEA NOT NULL
);

CREATE TABLE inbox (
    event_id     BIGSERIAL PRIMARY KEY,
    object_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    payload      BYTEA NOT NULL,
    dedupe_key   TEXT,
    sent_at      DOUBLE PRECISION NOT NULL,
    consumed_seq BIGINT,
    seal         BYTEA NOT NULL DEFAULT '\x'::bytea,
    UNIQUE (object_id, dedupe_key)
);

CREATE INDEX inbox_pending ON inbox (object_id, name) WHERE consumed_seq IS NULL;

-- Node certificates and key revocations, each signed by a root key (opaque to the
-- store: which roots to trust is every node's own configuration, never the store's).
CREATE TABLE trust (
    item_id    TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    body       BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

-- Each object's data key, wrapped by a node's key-encryption key (which never comes
-- here); outside the hash chain, so re-wrapping rewrites no memory record.
CREATE TABLE data_keys (
    object_id  TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    wrapped    BYTEA NOT NULL,
    seal_all   BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE INDEX data_keys_by_key ON data_keys (key_id);
CREATE TABLE checkpoints (
    object_id  TEXT NOT NULL,
    slot       TEXT NOT NULL,
    epoch      BIGINT NOT NULL,
    after_seq  BIGINT NOT NULL,
    after_hash TEXT NOT NULL,
    body       BYTEA NOT NULL,
    signer     TEXT NOT NULL,
    signature  BYTEA NOT NULL,
    written_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (object_id, slot)
);

-- Model quotas (perdure.core.quotas): declared rates and what 429s taught, and the
-- reservations in each quota's window.
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

-- Alerts and notifications (perdure.telemetry.alerts): one row per (rule, subject),
-- written conditionally so that one node's write wins each change.
CREATE TABLE alerts (
    rule        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    state       TEXT NOT NULL,
    summary     TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    fired_at    DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION,
    changed_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (rule, subject)
);
CREATE INDEX alerts_changed ON alerts (changed_at);
