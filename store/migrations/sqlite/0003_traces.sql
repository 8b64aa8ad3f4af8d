-- A session's place in its tree's trace, when spans are exported: the W3C
-- traceparent of its life span (what its agent receives) and the id of the
-- spawn span that created it (the life span's parent). NULL when untraced.
ALTER TABLE sessions ADD COLUMN traceparent TEXT;
ALTER TABLE sessions ADD COLUMN spawn_span_id TEXT;
