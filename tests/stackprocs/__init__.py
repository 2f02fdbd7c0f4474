"""Small Python programs used as real py-spy targets, and the helper that starts them."""
