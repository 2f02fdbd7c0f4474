"""The judge: `classify()` asks its stages in order, each returns candidates, and one place builds
the Verdict; the evaluators the stages call (evidence, generic classes, root causes, ranks) and
`replay`'s verdict from log lines alone. Pure: no clock, no I/O."""
