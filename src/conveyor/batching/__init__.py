"""Dynamic batching for one-shot models (embeddings and the like)."""

from conveyor.batching.batcher import Batcher
from conveyor.batching.item import ItemState, WorkItem
from conveyor.batching.queue import BatchQueue, CloseReason

__all__ = ["BatchQueue", "Batcher", "CloseReason", "ItemState", "WorkItem"]
