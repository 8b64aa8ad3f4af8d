-- A new session's 'created' event and each inbox message's 'message' event
-- are written by the store's code, beside the row they follow, as on
-- PostgreSQL; the triggers that wrote them go. (From 0020 on, both
-- backends' migrations have the same numbers and meaning.)
DROP TRIGGER sessions_created_event;
DROP TRIGGER messages_message_event;
