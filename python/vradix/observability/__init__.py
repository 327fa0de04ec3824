"""What an engine tells its operators, read-only: the inspector's snapshot (`snapshot`) and the Prometheus gauges
(`metrics`)."""
