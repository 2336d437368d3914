-- perdure SQLite schema, version 7: the dashboard's objects list, newest first, paged by
-- key (created_at, object_id) over every object, and the objects a node holds.
CREATE INDEX objects_created ON objects (created_at, object_id);
CREATE INDEX objects_lease_owner ON objects (lease_owner) WHERE lease_owner IS NOT NULL;
