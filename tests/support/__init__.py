"""Fakes and helpers shared by the tests, each defined once: upstream fakes
(`fakes`, `fake_anthropic`, `threaded_site`, `forward_proxy`), the gateway under test
(`servers`), real stores and faults in them (`postgres`, `redis_server`, `tcp_proxy`), wire
shapes (`openai_shapes`, `helpers`), sample payloads (`samples`) and error assertions (`envelopes`)."""
