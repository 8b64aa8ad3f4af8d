-- Request ids are remembered for --request-id-retention-secs; the owner of
-- the background work prunes older records in batches.
CREATE INDEX idempotency_created ON idempotency (created_at_ms);
