-- A session's own result (FinishSession): its outcome and text, both NULL
-- unless it finished its task. Read apart from the session row (the ledger
-- does not hold them).
ALTER TABLE sessions ADD COLUMN outcome TEXT CHECK (outcome IN ('success', 'failure'));
ALTER TABLE sessions ADD COLUMN result TEXT;
-- A finished session's process is asked to stop no sooner than this (ms
-- since the Unix epoch): its grace to exit on its own. NULL: at once.
ALTER TABLE processes ADD COLUMN stop_after_ms INTEGER;
