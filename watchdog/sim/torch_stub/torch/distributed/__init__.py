"""Stand-in for the `torch.distributed` package (only the collective the simulator needs)."""
