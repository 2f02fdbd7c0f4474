"""The pure core: the observation model, what is known of the server, the knowledge and the judge.

Four roles, each importing only those before it (tests/test_layers.py checks):

- the base: the observation model (`model`), the server's states (`states`), the numbers that
  change a verdict (`thresholds`) and redaction (`redact`);
- `knowledge/`: every rule type's schema and the one loader of each data file (signatures,
  generic classes, operations, rank rules, the published-versions record);
- `state/`: what one log line means (`events`), the window of observations, leases and open
  operations, each rank's progress, timelines: what is known of the server now;
- `judge/`: `classify()` as ordered stages, the evaluators they call, and `replay`'s verdict
  from log lines alone.

It imports nothing outside itself, so replay and tests run it without any source, output or
daemon.
"""
