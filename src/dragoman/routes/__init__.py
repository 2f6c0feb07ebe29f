"""Routes by the request's shape, and fallbacks from one model to another (docs/routing.md).

Below the assembly, above protocol and tokens: `settings` (the configuration, a leaf that
`core.config` embeds), `shape` and `conditions` (pure), `table` (which route a request takes),
`sessions` (stickiness), `answer` (the local count), `fallbacks` and `gate` (another model
before the first byte reaches the client).
"""
