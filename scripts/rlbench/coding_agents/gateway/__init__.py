"""The per-run LLM gateway (a LiteLLM proxy subprocess) between a coding-agent tool and its LLM driver.

rlbench.coding_agents.gateway.gateway is the harness side (LLMGateway); rlbench.coding_agents.gateway.recorder is the callback that runs
inside the proxy (stdlib and litellm only). Nothing is imported here, so that loading the package stays cheap.
"""
