"""Python stacks of the server's processes: py-spy capture, its output parsed, its text."""
