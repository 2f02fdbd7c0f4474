"""Signal sources: each reads one thing about the server and never raises into the loop."""
