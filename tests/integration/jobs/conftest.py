"""The store tests' per-backend fixtures (fresh SQLite file or PostgreSQL database)."""

from tests.integration.stores.conftest import (  # noqa: F401  (re-exported fixtures)
    job_store_url,
    postgres_admin_url,
    postgres_url,
)
