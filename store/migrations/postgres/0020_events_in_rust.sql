-- SQLite's 0020 drops the triggers that wrote 'created' and 'message'
-- events there; PostgreSQL's store always wrote them itself, so nothing
-- changes here. (From 0020 on, both backends' migrations have the same
-- numbers and meaning.)
SELECT 1;
