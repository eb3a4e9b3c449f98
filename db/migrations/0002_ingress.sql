-- Ingress inbox (SPEC ING-1, ING-5, ING-6, ING-7).
-- Ids are the protocol identities themselves (protocol/event_identity.py), so a
-- re-delivery lands on the same primary key and the correlation id returned to
-- the sender is known before the commit.
-- Payloads are stored as the exact JSON text received (numbers untouched); jsonb
-- would reject some valid JSON strings (\u0000) and renormalise numbers.

CREATE TABLE connector_event (
    event_id            text        PRIMARY KEY,
    endpoint            text        NOT NULL,
    event_type          text        NOT NULL,
    handler             text        NOT NULL,
    payload             text        NOT NULL,
    first_receipt_id    text        NOT NULL,
    status              text        NOT NULL DEFAULT 'admitted'
        CHECK (status IN ('admitted', 'processed', 'skipped', 'dead')),
    status_reason       text,
    -- Set by whoever started the processing workflow; the relay starts the rest.
    workflow_started_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'admitted') = (status_reason IS NULL))
);

CREATE INDEX connector_event_unstarted
    ON connector_event (created_at) WHERE workflow_started_at IS NULL;

CREATE TABLE ingress_receipt (
    receipt_id   text        PRIMARY KEY,
    endpoint     text        NOT NULL,
    request_id   text        NOT NULL,
    -- NULL for an unrouted event: a receipt with no business event.
    event_id     text        REFERENCES connector_event (event_id),
    event_type   text,
    attempt      text,
    payload      text        NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX ingress_receipt_event ON ingress_receipt (event_id);
CREATE INDEX ingress_receipt_request ON ingress_receipt (request_id);

-- Receipts are evidence: append-only.
CREATE FUNCTION ingress_receipt_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ingress_receipt is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER ingress_receipt_append_only
    BEFORE UPDATE OR DELETE ON ingress_receipt
    FOR EACH ROW EXECUTE FUNCTION ingress_receipt_append_only();

CREATE TABLE workflow_action_execution (
    execution_id        text        PRIMARY KEY,
    endpoint            text        NOT NULL,
    callback_id         text        NOT NULL,
    action_id           text        NOT NULL,
    receipt_id          text        NOT NULL REFERENCES ingress_receipt (receipt_id),
    payload             text        NOT NULL,
    expires_at          timestamptz NOT NULL,
    -- admitted -> enqueued -> observed -> delivered, or stopped (expired / operator).
    phase               text        NOT NULL DEFAULT 'admitted'
        CHECK (phase IN ('admitted', 'enqueued', 'observed', 'delivered', 'stopped')),
    event_id            text        REFERENCES connector_event (event_id),
    outcome             text        CHECK (outcome IN ('SUCCESS', 'FAIL_CONTINUE')),
    callback_status     integer,
    stop_reason         text,
    workflow_started_at timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (endpoint, callback_id)
);

CREATE INDEX workflow_action_execution_unstarted
    ON workflow_action_execution (created_at) WHERE workflow_started_at IS NULL;
