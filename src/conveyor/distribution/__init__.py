"""Model distribution: content-addressed chunks in the object store, pulled and shared.

A model directory is split into chunks named by their SHA-256 (`manifest`); a manifest under
the model's name lists the files and their chunks. Workers pull chunks into a local cache
(`chunk_cache`), verify each before use, and serve verified chunks to their peers; which
worker holds which chunk is recorded in the job store (the tracker). Which chunk to fetch
from where is decided by pure logic (`planner`); the disk budget's evictions too
(`disk_budget`).
"""
