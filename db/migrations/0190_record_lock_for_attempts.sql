-- G-2 (prior ownership is serialized): a create is reserved only by a transaction that
-- holds its record's admission lock, so no path can decide a create beside another save
-- of the same record under another slot without waiting for it.
--
-- `connector_record_lock_key` is the one home of the lock's key: admission takes
-- pg_advisory_xact_lock(connector_record_lock_class(), connector_record_lock_key(...))
-- for each record (db/link_batches.LOCK_RECORDS), and the trigger below refuses an
-- attempt row inserted by a transaction that does not hold it. One pg_locks read per
-- INSERT statement, whatever its row count (a batch of saves is one statement).

CREATE OR REPLACE FUNCTION connector_record_lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1194459138 $$;  -- 0x47320002

CREATE OR REPLACE FUNCTION connector_record_lock_key(owner_key text, source_object text,
                                                     source_record_id text)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtext(owner_key || chr(31) || source_object || chr(31) || source_record_id)
$$;

CREATE OR REPLACE FUNCTION connector_push_attempt_record_locked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    unlocked record;
BEGIN
    SELECT n.link_key, n.source_record_id INTO unlocked
    FROM new_attempts n
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
          AND l.objsubid = 2
          AND l.classid = connector_record_lock_class()::oid
          AND l.objid = connector_record_lock_key(
                n.connector_owner_key, n.source_object, n.source_record_id)::oid
    )
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'attempt for % reserved without its record''s admission lock (G-2)',
            unlocked.link_key
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'reserve creates through admission (services.admission), which '
                         'locks each record before the prior-ownership gate reads';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS connector_push_attempt_record_locked_tg ON connector_push_attempt;
CREATE TRIGGER connector_push_attempt_record_locked_tg
    AFTER INSERT ON connector_push_attempt
    REFERENCING NEW TABLE AS new_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION connector_push_attempt_record_locked();
