-- perdure SQLite schema, version 11: named queues (perdure.core.flow). An object
-- started on a queue carries its name, its key there, its priority and its dedupe key;
-- queues holds each queue's limits. A claim counts a queue's slots (its objects under a
-- live lease) under the write lock, so claims from many processes take turns.
-- objects_ready leaves out queued objects: claim_candidates never reads them.
-- started_at is when an object was first claimed (what a limiter counts).
ALTER TABLE objects ADD COLUMN queue TEXT;
ALTER TABLE objects ADD COLUMN queue_key TEXT;
ALTER TABLE objects ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN started_at REAL;
ALTER TABLE objects ADD COLUMN dedupe_key TEXT;
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
DROP INDEX objects_ready;
CREATE INDEX objects_ready ON objects (ready_at)
WHERE ready_at IS NOT NULL AND (paused = 0 OR cancel_requested = 1) AND queue IS NULL;
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
