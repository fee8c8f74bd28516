-- The keys that sign the requestState of MCP 2026-07-28 multi-round calls,
-- kept with the data so that every broker on this database accepts what
-- any of them signed, before and after a restart. One key per rotation
-- period (epoch = start of the period in ms / the period's length), made
-- by the first broker that needs it; maintenance deletes a key once no
-- state it signed is accepted any more. Secrets: no view shows them.

CREATE TABLE request_state_keys (
    epoch      INTEGER PRIMARY KEY,
    secret     BLOB    NOT NULL CHECK (length(secret) = 32),
    created_at INTEGER NOT NULL
) STRICT;
