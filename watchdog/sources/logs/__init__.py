"""Log lines from files, pipes and the journal, into LogEvents: read, split, prefilter, parse."""
