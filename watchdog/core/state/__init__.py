"""What is known of the server now: each log line's meaning, decided once (`events`), the window
of observations and the facts that outlive it, leases and open operations, each rank's role and
progress, and recorded timelines. Pure: the daemon feeds it, the judge reads it."""
