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
ALTER TABLE messages ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE messages SET bytes = octet_length(body);
ALTER TABLE sessions ADD COLUMN unread_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE sessions SET unread_bytes = u.bytes
FROM (SELECT session_id, SUM(bytes) AS bytes FROM messages
      WHERE delivered_at_ms IS NULL GROUP BY session_id) u
WHERE u.session_id = sessions.session_id;

-- The byte rate's state beside the message rate's.
ALTER TABLE message_rates ADD COLUMN bytes_tat_ms BIGINT NOT NULL DEFAULT 0;
