-- perdure PostgreSQL schema, version 5: each object's data key, wrapped by a node's
-- key-encryption key (which never comes here). Outside the hash chain on purpose:
-- re-wrapping under a new key-encryption key rewrites no memory record.
CREATE TABLE data_keys (
    object_id  TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    wrapped    BYTEA NOT NULL,
    seal_all   BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX data_keys_by_key ON data_keys (key_id);
