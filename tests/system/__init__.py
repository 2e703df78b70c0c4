"""Across the packages: the model-based test, races, stress, the feature pairs, fuzzing, security,
the README, docs, examples, packaging and benchmark harness.
"""
