"""``python -m conveyor`` runs the CLI."""

from conveyor.cli import app

app()
