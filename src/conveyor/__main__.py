"""``python -m conveyor`` runs the CLI."""

from conveyor.cli.main import app

app()
