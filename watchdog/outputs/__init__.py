"""Outputs: the metrics exporter, the event emitter, the incident bundle, sd_notify."""
