-- perdure PostgreSQL schema, version 6: the dashboard's objects list, newest first, paged
-- by key (created_at, object_id) over every object.
CREATE INDEX objects_created ON objects (created_at, object_id);
