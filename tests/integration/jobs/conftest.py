"""The store tests' per-backend fixture (fresh SQLite file or PostgreSQL database)."""

from tests.integration.stores.conftest import job_store_url  # noqa: F401  (re-exported fixture)
