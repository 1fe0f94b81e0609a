"""Helpers the tests share (no fixtures: those live in conftest.py files); a test imports
these, never a conftest or another test module."""
