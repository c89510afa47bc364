"""The HTTP surface: thin handlers that parse, call the service, and format."""
