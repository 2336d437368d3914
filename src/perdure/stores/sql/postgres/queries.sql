-- Named queries of the PostgreSQL store: one block per `-- name:` line.
-- Lease times are decided by the database clock (db_now below); timers (ready_at)
-- are the nodes' wall-clock times.

-- name: register_node
INSERT INTO nodes (node_id, public_key, created_at) VALUES (%s, %s, %s)
ON CONFLICT (node_id) DO NOTHING;

-- name: node_key
SELECT public_key FROM nodes WHERE node_id = %s;

-- name: public_keys
SELECT node_id, public_key FROM nodes;

-- name: insert_object
INSERT INTO objects (object_id, agent, agent_version, status, phase, epoch, ready_at,
                     head_seq, head_hash, parent_id, created_at, updated_at, requires)
VALUES (%(object_id)s, %(agent)s, %(agent_version)s, 'ready', 'instantiated', 0, %(ready_at)s,
        %(head_seq)s, %(head_hash)s, %(parent_id)s, %(now)s, %(now)s, %(requires)s)
ON CONFLICT (object_id) DO NOTHING;

-- name: insert_record
INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body,
                     prev_hash, hash, signature)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: get_object
SELECT * FROM objects WHERE object_id = %s;

-- name: records_after
SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, prev_hash, hash,
       signature
FROM records WHERE object_id = %s AND seq > %s ORDER BY seq;

-- name: claim
WITH db AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now),
candidates AS (
    SELECT o.object_id FROM objects o, db
    WHERE o.ready_at <= %(now)s
      AND (o.paused = FALSE OR o.cancel_requested)
      AND (o.lease_expires IS NULL OR o.lease_expires <= db.now)
      AND (o.cancel_requested OR (
            (%(serves)s::text[] IS NULL
             OR (o.agent || '@' || o.agent_version) = ANY(%(serves)s::text[]))
        AND o.requires <@ %(caps)s::text[]
        AND NOT (%(node)s::text = ANY(o.avoid))))
    ORDER BY o.ready_at
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE objects o
SET epoch = o.epoch + 1, lease_owner = %(owner)s, lease_expires = db.now + %(lease)s,
    status = 'running', phase = 'evaluation', updated_at = %(now)s
FROM candidates c, db
WHERE o.object_id = c.object_id
RETURNING o.object_id, o.epoch, o.lease_expires, o.cancel_requested, o.paused;

-- name: renew
UPDATE objects
SET lease_expires = extract(epoch FROM clock_timestamp())::double precision + %(lease)s
WHERE object_id = %(object_id)s AND epoch = %(epoch)s AND lease_owner IS NOT NULL
RETURNING object_id, epoch, lease_expires, cancel_requested, paused;

-- name: append_update
UPDATE objects
SET head_seq = COALESCE(%(head_seq)s, head_seq),
    head_hash = COALESCE(%(head_hash)s, head_hash),
    status = %(status)s,
    phase = %(phase)s,
    ready_at = CASE
        -- A cancel asked for while the node ran must not be lost when it lets go.
        WHEN cancel_requested AND %(status)s NOT IN ('completed', 'failed', 'cancelled')
        THEN %(now)s
        WHEN %(waiting_event)s::text IS NOT NULL AND EXISTS (
            SELECT 1 FROM inbox
            WHERE inbox.object_id = %(object_id)s AND inbox.name = %(waiting_event)s::text
              AND inbox.consumed_seq IS NULL)
        THEN %(now)s
        ELSE %(ready_at)s::double precision END,
    waiting_event = %(waiting_event)s::text,
    result = COALESCE(%(result)s, result),
    lease_owner = CASE WHEN %(release)s THEN NULL ELSE lease_owner END,
    lease_expires = CASE WHEN %(release)s THEN NULL ELSE lease_expires END,
    parked = %(parked)s,
    note = %(note)s,
    requires = COALESCE(%(requires)s::text[], requires),
    avoid = CASE WHEN %(clear_avoid)s THEN '{}'::text[]
                 WHEN %(avoid_node)s::text IS NOT NULL THEN array_append(avoid, %(avoid_node)s::text)
                 ELSE avoid END,
    updated_at = %(now)s
WHERE object_id = %(object_id)s AND epoch = %(epoch)s
  AND (%(expected_head)s::bigint IS NULL OR head_seq = %(expected_head)s::bigint)
RETURNING ready_at;

-- name: consume_event
UPDATE inbox SET consumed_seq = %s
WHERE event_id = %s AND object_id = %s AND consumed_seq IS NULL;

-- name: object_status
SELECT status FROM objects WHERE object_id = %s FOR UPDATE;

-- name: insert_event
INSERT INTO inbox (object_id, name, payload, dedupe_key, sent_at) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (object_id, dedupe_key) DO NOTHING;

-- name: wake_for_event
-- Wakes an object waiting for this event; a control event (``perdure:`` prefix) wakes any.
UPDATE objects SET ready_at = %(now)s
WHERE object_id = %(object_id)s AND lease_owner IS NULL
  AND (waiting_event = %(name)s OR left(%(name)s, 8) = 'perdure:')
  AND (ready_at IS NULL OR ready_at > %(now)s);

-- name: notify
SELECT pg_notify('perdure_wake', %s);

-- name: pending_events
SELECT event_id, object_id, name, payload, dedupe_key, sent_at FROM inbox
WHERE object_id = %s AND consumed_seq IS NULL ORDER BY event_id;

-- name: set_paused
UPDATE objects SET paused = %(paused)s, updated_at = %(now)s,
                   status = CASE WHEN NOT %(paused)s AND status = 'paused' THEN 'ready'
                                 ELSE status END
WHERE object_id = %(object_id)s;

-- name: request_cancel
UPDATE objects SET cancel_requested = TRUE,
                   ready_at = LEAST(COALESCE(ready_at, %(now)s), %(now)s),
                   updated_at = %(now)s
WHERE object_id = %(object_id)s;

-- name: unpark
UPDATE objects SET parked = FALSE, note = NULL, ready_at = %(now)s, status = 'ready',
                   updated_at = %(now)s
WHERE object_id = %(object_id)s AND parked;

-- name: next_ready_at
-- When the next object becomes claimable: its ready time, or its lease expiry if later.
SELECT MIN(GREATEST(ready_at, COALESCE(lease_expires, ready_at)))
FROM objects WHERE ready_at IS NOT NULL AND (paused = FALSE OR cancel_requested);

-- name: leases_held
SELECT object_id, lease_owner, epoch FROM objects
WHERE lease_owner LIKE %(prefix)s
  AND lease_expires > extract(epoch FROM clock_timestamp())::double precision;

-- name: expire_lease
UPDATE objects
SET lease_expires = extract(epoch FROM clock_timestamp())::double precision,
    updated_at = %(now)s
WHERE object_id = %(object_id)s AND epoch = %(epoch)s AND lease_owner = %(owner)s;

-- name: control_flags
SELECT object_id, epoch, cancel_requested, paused FROM objects WHERE object_id = ANY(%s);

-- name: heartbeat
UPDATE nodes SET serves = %(serves)s, capabilities = %(caps)s, seen_at = %(now)s
WHERE node_id = %(node_id)s;

-- name: live_nodes
SELECT node_id, serves, capabilities, seen_at FROM nodes
WHERE seen_at IS NOT NULL AND seen_at >= %(since)s ORDER BY node_id;
