"""The planner's own error.  The model shapes it counts with (ModelShape, PRESETS,
a config.json reader) are contract/models.py's, shared with the sweep's
`--sizes model:NAME`."""


class PlanError(ValueError):
    """Bad plan input (one-line message, exit 2)."""
