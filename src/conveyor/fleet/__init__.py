"""The multi-process fleet: workers host models, gateways route online requests to them."""
