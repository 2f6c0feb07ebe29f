"""The composition root: the gateway that builds every part, the one request pipeline, and
what observes a request (metrics, logs, traces). Above every feature package; below server/."""
