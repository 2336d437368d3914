-- perdure SQLite schema: what applying every file in migrations/ yields.
-- version: 13
-- Checked by tests/migration: when a migration changes the schema, update this file.

CREATE TABLE nodes (
    node_id     TEXT PRIMARY KEY,
    public_key  BLOB NOT NULL,
    created_at  REAL NOT NULL,
    serves TEXT NOT NULL DEFAULT '[]',
    capabilities TEXT NOT NULL DEFAULT '[]',
    seen_at REAL,
    live_until REAL
);

CREATE TABLE objects (
    object_id        TEXT PRIMARY KEY,
    agent            TEXT NOT NULL,
    agent_version    TEXT NOT NULL,
    status           TEXT NOT NULL,
    phase            TEXT NOT NULL,
    epoch            INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires    REAL,
    ready_at         REAL,
    waiting_event    TEXT,
    paused           INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    parked           INTEGER NOT NULL DEFAULT 0,
    note             TEXT,
    head_seq         INTEGER NOT NULL,
    head_hash        BLOB NOT NULL,
    result           BLOB,
    parent_id        TEXT,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    requires TEXT NOT NULL DEFAULT '[]',
    avoid TEXT NOT NULL DEFAULT '[]',
    crashes INTEGER NOT NULL DEFAULT 0,
    crash_seq INTEGER,
    queue TEXT,
    queue_key TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    dedupe_key TEXT
);

-- Runnable objects by ready time, and by due time (the ready time, or the lease expiry if
-- later): an idle or claiming node reads only what is due or held, however many sleep.
CREATE INDEX objects_ready ON objects (ready_at)
WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1) AND queue IS NULL;
CREATE INDEX objects_due ON objects (
    CASE WHEN lease_expires IS NOT NULL AND lease_expires > ready_at
         THEN lease_expires ELSE ready_at END)
WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);
CREATE INDEX objects_status ON objects (status, created_at);
CREATE INDEX objects_agent ON objects (agent, created_at);
CREATE INDEX objects_parent ON objects (parent_id, created_at) WHERE parent_id IS NOT NULL;
CREATE INDEX objects_created ON objects (created_at, object_id);
CREATE INDEX objects_lease_owner ON objects (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX objects_queued ON objects (queue, priority, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);
CREATE INDEX objects_queue_ready ON objects (queue, ready_at)
WHERE queue IS NOT NULL AND ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1);
CREATE INDEX objects_queue_held ON objects (queue, queue_key)
WHERE queue IS NOT NULL AND lease_owner IS NOT NULL;
CREATE INDEX objects_queue_starts ON objects (queue, started_at)
WHERE queue IS NOT NULL AND started_at IS NOT NULL;
CREATE UNIQUE INDEX objects_dedupe ON objects (queue, dedupe_key)
WHERE dedupe_key IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled');

-- Named queues and their limits (perdure.core.flow); a claim counts each queue's slots.
CREATE TABLE queues (
    name               TEXT PRIMARY KEY,
    concurrency        INTEGER,
    per_key            INTEGER,
    worker_concurrency INTEGER,
    rate_limit         INTEGER,
    rate_period        REAL,
    priority           INTEGER NOT NULL DEFAULT 0,
    updated_at         REAL NOT NULL
);

CREATE TABLE records (
    object_id   TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    trace_id    TEXT NOT NULL,
    ts_us       INTEGER NOT NULL,
    node_id     TEXT NOT NULL,
    policy_ref  TEXT NOT NULL,
    kind        TEXT NOT NULL,
    body        BLOB NOT NULL,
    prev_hash   BLOB NOT NULL,
    hash        BLOB NOT NULL,
    signature   BLOB NOT NULL
);

-- Records sit in the order they were written; this index finds an object's in seq order
-- (and refuses a second record at the same seq).
CREATE UNIQUE INDEX records_object_seq ON records (object_id, seq);

-- One signature over every record a node wrote in one commit; a sealed record holds
-- b"S" + digest in its signature column.
CREATE TABLE seals (
    digest    BLOB PRIMARY KEY,
    node_id   TEXT NOT NULL,
    hashes    BLOB NOT NULL,
    signature BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE inbox (
    event_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    object_id    TEXT NOT NULL,
    name         TEXT NOT NULL,
    payload      BLOB NOT NULL,
    dedupe_key   TEXT,
    sent_at      REAL NOT NULL,
    consumed_seq INTEGER,
    seal BLOB NOT NULL DEFAULT X'',
    UNIQUE (object_id, dedupe_key)
);

CREATE INDEX inbox_pending ON inbox (object_id, name) WHERE consumed_seq IS NULL;

-- Node certificates and key revocations, each signed by a root key (opaque to the
-- store: which roots to trust is every node's own configuration, never the store's).
CREATE TABLE trust (
    item_id    TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    body       BLOB NOT NULL,
    created_at REAL NOT NULL
);

-- Each object's data key, wrapped by a node's key-encryption key (which never comes
-- here); outside the hash chain, so re-wrapping rewrites no memory record.
CREATE TABLE data_keys (
    object_id  TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    wrapped    BLOB NOT NULL,
    seal_all   INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
) WITHOUT ROWID;

CREATE INDEX data_keys_by_key ON data_keys (key_id);
CREATE TABLE checkpoints (
    object_id  TEXT NOT NULL,
    slot       TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    after_seq  INTEGER NOT NULL,
    after_hash TEXT NOT NULL,
    body       BLOB NOT NULL,
    signer     TEXT NOT NULL,
    signature  BLOB NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (object_id, slot)
) WITHOUT ROWID;

-- Model quotas (perdure.core.quotas): declared rates and what 429s taught, and the
-- reservations in each quota's window.
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

-- Alerts and notifications (perdure.telemetry.alerts): one row per (rule, subject),
-- written conditionally so that one node's write wins each change.
CREATE TABLE alerts (
    rule        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    state       TEXT NOT NULL,
    summary     TEXT NOT NULL,
    node_id     TEXT NOT NULL,
    fired_at    REAL NOT NULL,
    resolved_at REAL,
    changed_at  REAL NOT NULL,
    PRIMARY KEY (rule, subject)
) WITHOUT ROWID;
CREATE INDEX alerts_changed ON alerts (changed_at);
