-- A message's body is stored once however many inboxes hold it, keyed by
-- the id of the first message that carries it; each inbox entry keeps the
-- body's size in bytes, and each session the bytes of its inbox not yet
-- delivered (bounded by --max-unread-bytes). Entries written before keep
-- their body in `messages.body` (`body_id` NULL); later ones leave it empty.
CREATE TABLE message_bodies (
    body_id  TEXT PRIMARY KEY NOT NULL,
    body     TEXT NOT NULL
);
ALTER TABLE messages ADD COLUMN body_id TEXT REFERENCES message_bodies (body_id);
ALTER TABLE messages ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE messages SET bytes = length(CAST(body AS BLOB));
ALTER TABLE sessions ADD COLUMN unread_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET unread_bytes = (
    SELECT COALESCE(SUM(m.bytes), 0) FROM messages m
    WHERE m.session_id = sessions.session_id AND m.delivered_at_ms IS NULL);

-- The byte rate's state beside the message rate's.
ALTER TABLE message_rates ADD COLUMN bytes_tat_ms INTEGER NOT NULL DEFAULT 0;

-- An entry counts its bytes unread, and its event names its size (the body
-- is no longer in the row).
DROP TRIGGER messages_advance_inbox_seq;
CREATE TRIGGER messages_advance_inbox_seq AFTER INSERT ON messages BEGIN
    UPDATE sessions SET inbox_seq = NEW.seq, unread_bytes = unread_bytes + NEW.bytes
    WHERE session_id = NEW.session_id;
END;
DROP TRIGGER messages_message_event;
CREATE TRIGGER messages_message_event AFTER INSERT ON messages BEGIN
    INSERT INTO events (session_id, seq, kind, status, at_ms, detail)
    SELECT s.session_id, s.event_seq + 1, 'message', s.status, NEW.created_at_ms,
           json_object('message_id', NEW.message_id, 'inbox_sequence', NEW.seq,
                       'bytes', NEW.bytes)
    FROM sessions s WHERE s.session_id = NEW.session_id;
END;
