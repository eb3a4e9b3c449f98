-- Every change to pack installs notifies the processes that cache what the active packs
-- declare (the CRM entry's budget rates, PROF-3), so they keep a cache until it is
-- stale instead of re-reading it on a timer (P2: no periodic transaction per process).
-- A statement-level trigger: one notification per statement, delivered at commit.
CREATE FUNCTION connector_packs_changed_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('connector_packs_changed', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER pack_install_changed_notify
    AFTER INSERT OR UPDATE OR DELETE ON pack_install
    FOR EACH STATEMENT EXECUTE FUNCTION connector_packs_changed_notify();
