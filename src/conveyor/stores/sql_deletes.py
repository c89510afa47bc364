"""The statements that delete a batch with its shards (``sql_queries`` holds the others).

Only Anthropic's Message Batches are deleted; OpenAI's batches, as OpenAI's, are kept.
"""

from __future__ import annotations

from conveyor.stores.sql_queries import shared

DELETE_BATCH = shared("delete_batch", "DELETE FROM batches WHERE id = :id AND tenant = :tenant")
# After its batch: SQLite cascades the foreign key only with a pragma set.
DELETE_BATCH_SHARDS = shared("delete_batch_shards", "DELETE FROM shards WHERE batch_id = :id")
