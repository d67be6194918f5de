"""Files other tools or the agent's side touch: durable JSON and JSON-lines records (jsonio) and reading a
directory the agent controls without following a link (nofollow).

Builds on: nothing in the library.
"""
