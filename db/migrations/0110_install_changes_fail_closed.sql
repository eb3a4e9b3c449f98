-- C-8 (seed drift row "create path changes"): a pack apply that changes an action slot's
-- createPath does not touch finalized links, but blocks new creates for that slot until
-- an operator validates the new path (`connector-push revalidate create-path`, recorded in
-- the audit trail). One row per (owner key, action slot): the last createPath change and,
-- once validated, who validated it. A row with validated_at null blocks creates.
CREATE TABLE action_slot_create_path (
    connector_owner_key     text        NOT NULL,
    action_slot_id          text        NOT NULL,
    create_path_template    text        NOT NULL,
    previous_create_path    text        NOT NULL,
    pack_install_id         uuid        NOT NULL REFERENCES pack_install (pack_install_id),
    changed_at              timestamptz NOT NULL DEFAULT now(),
    validated_by            text,
    validated_reason        text,
    validated_at            timestamptz,
    PRIMARY KEY (connector_owner_key, action_slot_id),
    CHECK ((validated_at IS NULL) = (validated_by IS NULL))
);

