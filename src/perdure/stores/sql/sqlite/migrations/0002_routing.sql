-- perdure SQLite schema, version 2: routing by code version and capability.
ALTER TABLE objects ADD COLUMN requires TEXT NOT NULL DEFAULT '[]';
ALTER TABLE objects ADD COLUMN avoid TEXT NOT NULL DEFAULT '[]';
CREATE INDEX objects_parent ON objects (parent_id, created_at) WHERE parent_id IS NOT NULL;
ALTER TABLE nodes ADD COLUMN serves TEXT NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]';
ALTER TABLE nodes ADD COLUMN seen_at REAL;
