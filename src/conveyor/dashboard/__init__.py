"""The live dashboard: a JSON state document and a static page that charts it."""
