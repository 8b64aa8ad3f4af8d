-- A runner's lease expiry is kept as milliseconds since the Unix epoch on
-- the database's clock, as on SQLite, so both backends read and write it
-- with one SQL text (the clock itself is each backend's: `db_now_ms!`).
--
-- The old column stays for a rolling update: replicas of the release before
-- this one still read and write `lease_expires` until they are replaced, so
-- a trigger keeps the two columns equal, whichever one a statement sets. A
-- later migration drops `lease_expires` and the trigger.
ALTER TABLE runners ADD COLUMN lease_expires_ms BIGINT;
UPDATE runners
SET lease_expires_ms = CAST(extract(epoch FROM lease_expires) * 1000 AS BIGINT)
WHERE lease_expires IS NOT NULL;

CREATE FUNCTION runners_lease_in_step() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.lease_expires IS DISTINCT FROM OLD.lease_expires
       OR TG_OP = 'INSERT' AND NEW.lease_expires_ms IS NULL THEN
        NEW.lease_expires_ms := CAST(extract(epoch FROM NEW.lease_expires) * 1000 AS BIGINT);
    ELSE
        NEW.lease_expires := to_timestamp(NEW.lease_expires_ms / 1000.0);
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER runners_lease_in_step BEFORE INSERT OR UPDATE ON runners
FOR EACH ROW EXECUTE FUNCTION runners_lease_in_step();
