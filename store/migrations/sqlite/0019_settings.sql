-- Settings every service on this database shares, by name: `limits`, the
-- limits the rules enforce (JSON), so that replicas enforce one set.
CREATE TABLE settings (
    name           TEXT PRIMARY KEY NOT NULL,
    value          TEXT NOT NULL,
    updated_at_ms  INTEGER NOT NULL
);
