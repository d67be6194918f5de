"""Headless OpenHands run (the software-agent SDK) for the OpenHands adapter: one conversation, one prompt.

Started by the OpenHands adapter (rlbench.coding_agents.adapters.openhands) inside the agent's sandbox with the OpenHands
venv's interpreter (Python >= 3.12): `python openhands_main.py <config.json>`. It imports nothing from
rlbench (the repository is hidden in the sandbox; only this file, the venv and its base interpreter are
shown), only the SDK and the standard library.

The config (written by the adapter under the agent's private home) holds: model (a LiteLLM string,
"openai/<gateway model>"), base_url (the run's LLM gateway, /v1 included), api_key (the gateway's per-run
key: never the provider's), workspace, prompt, max_iterations, num_retries, persistence_dir and optionally
timeout_s (one LLM call), terminal_type, condenser.

What it does: LLM(usage_id="agent", ...), an Agent with the Terminal and FileEditor tools (finish and think are
built in), the system prompt of OpenHands' CLI mode and its default condenser (LLMSummarizingCondenser on a
copy of the LLM, usage_id "condenser": old events are summarized so that a long run fits the context; its
calls go through the gateway too; "condenser": false in the config turns it off), and a
Conversation(workspace, max_iteration_per_run, persistence_dir, visualizer=None); send the prompt, run.
On stdout, one JSON object per line:

    {"event": "start", "sdk_version", "python", "model", "terminal_type", "max_iterations", "workspace"}
    {"event": "error", "type", "message"}                    (only when run() raised)
    {"event": "end", "execution_status", "conversation_id", "persistence_dir", "llm_calls",
     "metrics": {"accumulated_cost", "accumulated_token_usage": {prompt_tokens, completion_tokens,
                 cache_read_tokens, cache_write_tokens, reasoning_tokens, ...}}}

Exit status: 0 only when the conversation ended FINISHED (the agent called `finish`), 3 when it ended in
another state (max iterations reached: ERROR; stuck: STUCK), 1 when run() raised (the LLM endpoint failed,
the gateway refused a call beyond the run's limits), 2 on a bad config.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, "ts": round(time.time(), 3), **fields}, default=str), flush=True)


def metrics_of(conversation) -> tuple[dict | None, int | None]:
    """(metrics as a dict, number of LLM calls) of every LLM of the conversation, None where unreadable."""
    try:
        combined = conversation.conversation_stats.get_combined_metrics()
    except Exception:  # noqa: BLE001 - report what can be read
        return None, None
    try:
        usage = combined.accumulated_token_usage
        usage = usage.model_dump(mode="json") if usage is not None else None
    except Exception:  # noqa: BLE001
        usage = None
    if isinstance(usage, dict):
        usage.pop("per_turn_token", None)
    try:
        calls = len(combined.token_usages)
    except Exception:  # noqa: BLE001
        calls = None
    return {"accumulated_cost": getattr(combined, "accumulated_cost", None), "accumulated_token_usage": usage}, calls


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: openhands_main.py CONFIG.json", file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as handle:
            config = json.load(handle)
        model, base_url, api_key = config["model"], config["base_url"], config["api_key"]
        workspace, prompt = config["workspace"], config["prompt"]
    except (OSError, ValueError, KeyError) as error:
        print(f"openhands_main: bad config {argv[1]}: {error}", file=sys.stderr)
        return 2
    os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    from importlib.metadata import version

    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.file_editor import FileEditorTool
    from openhands.tools.terminal import TerminalTool

    terminal_type = config.get("terminal_type") or ("tmux" if shutil.which("tmux") else "subprocess")
    max_iterations = int(config.get("max_iterations") or 500)
    emit(
        "start",
        sdk_version=version("openhands-sdk"),
        python=sys.version.split()[0],
        model=model,
        terminal_type=terminal_type,
        max_iterations=max_iterations,
        workspace=workspace,
    )
    llm_options = {}
    if config.get("timeout_s"):
        llm_options["timeout"] = int(config["timeout_s"])
    llm = LLM(
        usage_id="agent",
        model=model,
        base_url=base_url,
        api_key=api_key,
        num_retries=int(config.get("num_retries", 1)),
        retry_min_wait=1,
        retry_max_wait=8,
        **llm_options,
    )
    agent_options = {}
    if config.get("condenser", True):  # OpenHands' default: summarize old events so a long run fits the context
        from openhands.tools.preset.default import get_default_condenser

        agent_options["condenser"] = get_default_condenser(llm=llm.model_copy(update={"usage_id": "condenser"}))
    agent = Agent(
        llm=llm,
        tools=[Tool(name=TerminalTool.name, params={"terminal_type": terminal_type}), Tool(name=FileEditorTool.name)],
        system_prompt_kwargs={"cli_mode": True},  # as OpenHands' own CLI preset: no browser in this environment
        **agent_options,
    )
    conversation = Conversation(
        agent=agent,
        workspace=workspace,
        persistence_dir=config.get("persistence_dir"),
        max_iteration_per_run=max_iterations,
        visualizer=None,
        delete_on_close=False,
    )
    raised = False
    try:
        conversation.send_message(prompt)
        conversation.run()
    except Exception as error:  # noqa: BLE001 - ConversationRunError and whatever the SDK raises
        raised = True
        cause = error.__cause__ or error
        emit("error", type=type(cause).__name__, message=str(cause)[:2000], wrapper=type(error).__name__)
        traceback.print_exc()
    status = getattr(conversation.state.execution_status, "value", str(conversation.state.execution_status))
    metrics, calls = metrics_of(conversation)
    emit(
        "end",
        execution_status=status,
        conversation_id=str(conversation.id),
        persistence_dir=str(getattr(conversation.state, "persistence_dir", None) or ""),
        llm_calls=calls,
        metrics=metrics,
    )
    try:
        conversation.close()
    except Exception:  # noqa: BLE001 - the run's outcome is already known
        traceback.print_exc()
    if raised:
        return 1
    return 0 if status == "finished" else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
