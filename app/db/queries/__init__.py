"""Query functions by concept. Each takes the connection first and never begins or commits."""
