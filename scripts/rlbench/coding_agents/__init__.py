"""CLI coding agents: the adapters (one per tool), the per-run LLM gateway, one agent's session (readiness,
prompt, gateway, launch, record) and the installation of the pinned tools under .tools/.

Builds on: paths, fileio.
"""
