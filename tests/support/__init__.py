"""Test-only servers run for real on 127.0.0.1 (an OIDC provider, uvicorn in a thread)."""
