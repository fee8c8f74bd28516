-- The keys that sign the requestState of MCP 2026-07-28 multi-round calls,
-- kept with the data so that every broker on this database accepts what
-- any of them signed, before and after a restart. The same table as
-- SQLite's V13.

CREATE TABLE request_state_keys (
    epoch      BIGINT PRIMARY KEY,
    secret     BYTEA  NOT NULL CHECK (octet_length(secret) = 32),
    created_at BIGINT NOT NULL
);
COMMENT ON TABLE request_state_keys IS 'Keys signing MCP 2026-07-28 requestState, one per rotation period (epoch); secrets, shown by no view.';
