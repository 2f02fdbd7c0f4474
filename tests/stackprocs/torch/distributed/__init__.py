"""Stand-in `torch.distributed` for py-spy tests."""
