"""Treadle."""
