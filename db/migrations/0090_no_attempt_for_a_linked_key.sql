-- ID-5, GATE-1: a link key that has a link never gets another create attempt. Admission
-- decides a PATCH whenever it finds the key's link, and finalize takes the key's lock so
-- an admission cannot read "no link" before the link commits and "attempt finalized,
-- slot free" after it. That lock is code that must remember; this is the line no code
-- path can cross: an INSERT of an attempt for a key whose link exists is refused
-- (CP004), so a missed lock fails closed instead of reserving a second create.
CREATE FUNCTION connector_push_attempt_linked_key_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF EXISTS (SELECT 1 FROM connector_remote_link l WHERE l.link_key = NEW.link_key) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'link key ' || NEW.link_key || ' has a link: a create attempt is never reserved');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE TRIGGER connector_push_attempt_linked_key_tg BEFORE INSERT ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_linked_key_guard();
