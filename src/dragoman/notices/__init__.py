"""Notes from the gateway itself to the person reading a reply, kept out of what the model sees
(`tools_dropped`: the model never saw the request's tools). Imports only `calls`."""
