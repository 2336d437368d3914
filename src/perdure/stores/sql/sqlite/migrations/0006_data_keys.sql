-- perdure SQLite schema, version 6: each object's data key, wrapped by a node's
-- key-encryption key (which never comes here). Outside the hash chain on purpose:
-- re-wrapping under a new key-encryption key rewrites no memory record.
CREATE TABLE data_keys (
    object_id  TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    wrapped    BLOB NOT NULL,
    seal_all   INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX data_keys_by_key ON data_keys (key_id);
