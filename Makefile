# Developer shortcuts; CI runs .ci/run, whose lint step is `make lint`'s commands.
PYTHON ?= python

.PHONY: lint test-fast test

# ruff, ruff format and mypy, as CI runs them.
lint:
	ruff check .
	ruff format --check .
	mypy

# Everything but the end-to-end modules (marked slow) and the real-engine tier.
test-fast:
	$(PYTHON) -m pytest -q -n 3 -m "not slow and not real_engine"

# The whole suite as CI runs it (the real-engine tier is .ci/run's last step).
test:
	$(PYTHON) -m pytest -q -n 3
