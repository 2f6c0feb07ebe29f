"""Per-key and per-tenant limits: token buckets (in-process, or shared in Redis), a
bounded queue for concurrency, and daily or monthly token budgets. See docs/team.md."""
