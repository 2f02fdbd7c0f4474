"""GPU samples: the backend interface, NVML, dcgm-exporter, a file, a fake, and the source."""
