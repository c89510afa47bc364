"""``conveyor plan``: the sizing arithmetic of a deployment, from presets or measurements."""
