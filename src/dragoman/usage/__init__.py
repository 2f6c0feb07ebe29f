"""Usage accounting: one record per finished request, written off the request path to
SQLite (one host) or PostgreSQL (a team's replicas), read back as Anthropic's usage report
and by `dragoman usage`."""
