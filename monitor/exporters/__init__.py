"""Stage 4, exporters: the Prometheus collector, the status page and JSON API, the event log."""
