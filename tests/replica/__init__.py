"""A real streaming replica: reads that may lag served by the standby (docs/adr/0033)."""
