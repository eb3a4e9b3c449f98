-- The HTTP save API's idempotency records (SPEC API-1): the first answer to each
-- client's `Idempotency-Key`, stored in the transaction that admitted the saves,
-- so a repeat returns it and admits nothing. Keys are scoped per client.
CREATE TABLE save_api_request (
    client_id       text        NOT NULL CHECK (client_id <> ''),
    idempotency_key text        NOT NULL CHECK (idempotency_key <> ''),
    -- sha256 of the canonical request (route and saves): the same key with another
    -- request is refused, never answered with the first one's decisions.
    request_hash    text        NOT NULL,
    answer          jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (client_id, idempotency_key)
);
