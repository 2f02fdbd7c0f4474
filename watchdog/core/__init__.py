"""The pure core: the observation model, the window, the classifier and the signatures as data.

It imports nothing outside itself (tests/test_layers.py checks), so replay and tests run it
without any source, output or daemon.
"""
