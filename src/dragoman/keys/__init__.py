"""API keys managed at run time: stored as salted digests beside the usage records (SQLite
or PostgreSQL), held in every process's memory as a digest map refreshed by polling a
version counter, and enforced per request (status, expiry, models, limits, a money
budget). The Admin API (`server/key_endpoints.py`) and `dragoman keys` manage them.
See docs/team.md."""
