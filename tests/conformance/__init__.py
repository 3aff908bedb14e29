"""Conformance corpus: span captures recorded from real third-party instrumentations.

See README.md in this folder. ``expected.load_cases()`` pairs each fixture with the runs a
person expects from it; ``record`` re-records the fixtures.
"""
