-- perdure PostgreSQL schema, version 4: trust items (node certificates and key
-- revocations, signed by a root, opaque to the store), the seal that vouches for each
-- queued event, and the count of workers that died in a row at an object's head.
CREATE TABLE trust (
    item_id    TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    body       BYTEA NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
ALTER TABLE inbox ADD COLUMN seal BYTEA NOT NULL DEFAULT '\x'::bytea;
ALTER TABLE objects ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN crash_seq BIGINT;
