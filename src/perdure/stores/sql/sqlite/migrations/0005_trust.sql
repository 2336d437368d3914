-- perdure SQLite schema, version 5: trust items (node certificates and key revocations,
-- signed by a root, opaque to the store), the seal that vouches for each queued event,
-- and the count of workers that died in a row at an object's head.
CREATE TABLE trust (
    item_id    TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    body       BLOB NOT NULL,
    created_at REAL NOT NULL
);
ALTER TABLE inbox ADD COLUMN seal BLOB NOT NULL DEFAULT X'';
ALTER TABLE objects ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN crash_seq INTEGER;
