-- S-7's erase triggers (0225) fire only on an update that can concern them: one that
-- sets values_erased_at, or any update of an erased row. Their body did nothing else, but
-- firing at all cost every attempt update its frozen request: `to_jsonb(NEW)` flattens
-- the trigger's NEW, which brings the out-of-line request_snapshot back inline, so the
-- row Postgres writes no longer points at the stored value and the request was TOASTed
-- again on each of a create's four writes (bench P9: 7,859 bytes of TOAST WAL per create
-- against 1,637 at 6e5fac5, before 0225). A PATCH's body the same.
DROP TRIGGER connector_push_attempt_values_erased_tg ON connector_push_attempt;
CREATE TRIGGER connector_push_attempt_values_erased_tg
    BEFORE UPDATE ON connector_push_attempt
    FOR EACH ROW
    WHEN (OLD.values_erased_at IS NOT NULL OR NEW.values_erased_at IS NOT NULL)
    EXECUTE FUNCTION connector_push_attempt_erase_values();

DROP TRIGGER connector_patch_dispatch_values_erased_tg ON connector_patch_dispatch;
CREATE TRIGGER connector_patch_dispatch_values_erased_tg
    BEFORE UPDATE ON connector_patch_dispatch
    FOR EACH ROW
    WHEN (OLD.values_erased_at IS NOT NULL OR NEW.values_erased_at IS NOT NULL)
    EXECUTE FUNCTION connector_patch_dispatch_erase_values();
