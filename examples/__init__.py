"""Example workflows shipped with Treadle."""
