"""Browser tests: Debian Chromium driven by Playwright against the real stack."""
