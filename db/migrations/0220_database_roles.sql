-- S-4 least privilege in Postgres: one role per process, created here, with grants.
--
-- The roles are NOLOGIN group roles. A migration is history kept in git and
-- checksummed, so it must not hold a password; authentication (passwords,
-- certificates, IAM, pg_hba) belongs to the deployment, which creates one LOGIN role
-- per process and grants it exactly one of these (docs/deployment.md, "Database
-- roles"). Each process then connects with its own DSN: the login decides the role.
--
--   connector_push_migrator  owns every table, sequence and function; granted only to
--                            the login that runs `connector-push migrate`
--   connector_push_worker    the worker: reads and writes what the protocol moves
--   connector_push_operator  the operator CLI: as the worker, plus `forget` (0225)
--   connector_push_save_api  the HTTP save API (API-1): admission writes attempts and
--                            PATCHes; it deletes nothing and never writes the audit trail
--   connector_push_ingress   the internet-facing webhook / workflow-action ingress:
--                            its inbox only; no links, attempts, PATCHes, journal, audit
--
-- No application role owns anything, so none can DISABLE TRIGGER, ALTER or DROP a
-- table: the append-only triggers (0001, 0010, 0040, 0041, 0170) hold for all of them.
-- On top of the triggers, no application role is granted UPDATE, DELETE or TRUNCATE on
-- the audit trail, the revalidation receipts, the remote-deletion evidence or the send
-- journal (only the worker may write a journal row's outcome columns, once: JRN-1).
-- Nobody is granted TRUNCATE.
--
-- Roles are cluster-wide: a second database on the same server (another installation,
-- a test database) finds them made, so creating one tolerates its existing twin.
-- A table a later migration adds has no grant until that migration grants it (fail
-- closed); tests/db/test_database_roles.py holds every table to a declared matrix.

DO $roles$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['connector_push_migrator', 'connector_push_worker',
                                'connector_push_operator', 'connector_push_save_api',
                                'connector_push_ingress'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- made by another database of this server, or a concurrent runner
        END;
    END LOOP;
    -- A non-superuser runner (CREATEROLE) must be able to hand objects to the owner role.
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT connector_push_migrator TO %I', current_user);
    END IF;
END;
$roles$;

-- -- ownership: the migrator role owns the schema's objects -------------------------

DO $owner$
DECLARE
    obj record;
BEGIN
    FOR obj IN
        SELECT c.oid::regclass AS name FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                          AND d.objid = c.oid AND d.deptype = 'e')
    LOOP
        -- a table's identity and serial sequences follow it
        EXECUTE format('ALTER TABLE %s OWNER TO connector_push_migrator', obj.name);
    END LOOP;
    FOR obj IN
        SELECT p.oid::regprocedure AS name FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                          AND d.objid = p.oid AND d.deptype = 'e')
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO connector_push_migrator', obj.name);
    END LOOP;
END;
$owner$;

-- -- worker and operator: what the protocol moves, minus the append-only tables -------

GRANT USAGE ON SCHEMA public TO connector_push_worker, connector_push_operator,
    connector_push_save_api, connector_push_ingress;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public
    TO connector_push_worker, connector_push_operator;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO connector_push_save_api;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public
    TO connector_push_worker, connector_push_operator, connector_push_save_api;

-- The migration ledger is the migrator's; the others may read which version they run on.
REVOKE ALL ON schema_migration
    FROM connector_push_worker, connector_push_operator, connector_push_save_api;
GRANT SELECT ON schema_migration
    TO connector_push_worker, connector_push_operator, connector_push_save_api;

-- Append-only for every application role (OPS-2, JRN-1, CP003): insert and read only.
REVOKE UPDATE, DELETE ON connector_operator_audit, connector_link_revalidation_receipt,
    connector_send_journal, connector_remote_deletion
    FROM connector_push_worker, connector_push_operator, connector_push_save_api;
-- JRN-1: a try's outcome is written once, by the send step (the trigger enforces once).
-- The columns are those db/journal.py's outcome statement sets.
GRANT UPDATE (outcome, status, response_hash, retry_after_seconds, remote_id, daily_refusal,
              outcome_at)
    ON connector_send_journal TO connector_push_worker;
-- Admission never appends evidence (the trail, the journal, receipts, deletions): those
-- are the worker's and the operator's (a send, an operator action, an inbound event).
REVOKE INSERT ON connector_operator_audit, connector_send_journal,
    connector_link_revalidation_receipt, connector_remote_deletion FROM connector_push_save_api;
-- Links and attempts are never deleted (G-3); say so in the grants too.
REVOKE DELETE ON connector_remote_link, connector_push_attempt
    FROM connector_push_worker, connector_push_operator;
-- The save API is not an inbox: webhook and workflow-action rows are the ingress's.
REVOKE ALL ON connector_event, ingress_receipt, workflow_action_execution
    FROM connector_push_save_api;

-- -- the ingress: its inbox, nothing else ------------------------------------------------
-- Webhooks insert events and receipts; workflow actions insert executions; the relay
-- and the after-commit start mark a row started (db/ingress_queries.py).

GRANT SELECT, INSERT ON connector_event, ingress_receipt, workflow_action_execution
    TO connector_push_ingress;
GRANT UPDATE (workflow_started_at) ON connector_event, workflow_action_execution
    TO connector_push_ingress;
