"""Link shapers (see `registry` for the interface and choices); kept import-light for the delay daemon."""
