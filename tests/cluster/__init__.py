"""Cluster tier: tests against a real control plane (see conftest.py and docs/testing.md)."""
