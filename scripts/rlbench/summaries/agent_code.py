"""What the agent's code shows: its code files, the training methods it uses, its key configuration
(hyper-parameters), a line of it as summaries quote it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from rlbench.grader.snapshot import snapshot_code

# What each training method looks like in code. Class names count only when called (an import
# alone proves nothing); bare method words (`loss_type="dpo"`, `trl sft`, `adv_estimator=grpo`)
# count anywhere except in full-line comments.
METHOD_PATTERNS = {
    "grpo": re.compile(r"\bGRPO(?:Trainer|Config)\s*\(|(?i:\bgrpo\b)"),
    # Other online policy-gradient methods (RLOO) are counted with PPO.
    "ppo": re.compile(r"\b(?:PPO|RLOO)(?:Trainer|Config)\s*\(|(?i:\b(?:ppo|rloo)\b)"),
    # "DPO (and other preference methods)".
    "preference": re.compile(
        r"\b(?:Online)?(?:DPO|ORPO|KTO|CPO|BCO|XPO|NashMD)(?:Trainer|Config)\s*\(|(?i:\b(?:dpo|orpo|kto|simpo)\b)"
    ),
    "sft": re.compile(r"\bSFT(?:Trainer|Config)\s*\(|\bSeq2SeqTrainer\s*\(|(?<![\w.])Trainer\s*\(|(?i:\bsft\b)"),
}
ROUTE_SUFFIXES = {".py", ".sh", ".bash", ".yaml", ".yml", ".toml", ".cfg"}
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt", ".md"}
MAX_SCAN_BYTES = 2_000_000
_FULL_LINE_COMMENT = re.compile(r"^\s*#.*$", re.M)
# Hyper-parameters shown as "key configuration" in summary.md.
CONFIG_KEYS = (
    "learning_rate",
    "lr",
    "num_train_epochs",
    "epochs",
    "max_steps",
    "per_device_train_batch_size",
    "batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "beta",
    "lora_r",
    "lora_rank",
    "lora_alpha",
)
_CONFIG_ASSIGN = re.compile(r"(?<![\w.])(" + "|".join(CONFIG_KEYS) + r")[\"']?\s*[=:](?!=)\s*")
#: A quoted line of code is cut to this many characters.
KEY_LINE_MAX_CHARS = 160


def code_files(code_dir: Path, suffixes: set[str] = CODE_SUFFIXES) -> list[Path]:
    """The files under code_dir with one of the suffixes, sorted; [] when there is no directory."""
    if not code_dir or not Path(code_dir).is_dir():
        return []
    return sorted(p for p in Path(code_dir).rglob("*") if p.is_file() and p.suffix in suffixes)


def _code_text(code_dir: Path | None) -> str:
    """The code and configs under code_dir, full-line comments removed."""
    parts = []
    for path in code_files(code_dir, ROUTE_SUFFIXES):
        if path.stat().st_size <= MAX_SCAN_BYTES:
            parts.append(_FULL_LINE_COMMENT.sub("", path.read_text(errors="replace")))
    return "\n".join(parts)


def training_methods(code_dir: Path | None) -> set[str]:
    """Which of grpo, ppo, preference, sft the code under code_dir uses."""
    text = _code_text(code_dir)
    return {name for name, pattern in METHOD_PATTERNS.items() if pattern.search(text)}


def final_code_methods(workspace: Path) -> set[str]:
    """training_methods of the workspace's final code/, read through the grader's link-free,
    bounded copy (grader.snapshot.snapshot_code): the agent's links are not followed."""
    with tempfile.TemporaryDirectory(prefix="rlbench-final-code-") as tmp:
        snapshot_code(Path(workspace), Path(tmp) / "code")
        return training_methods(Path(tmp) / "code")


def code_texts(code_dir: Path | None, suffixes: set[str] = CODE_SUFFIXES) -> dict[str, str]:
    """{relative path: text} of the code files under code_dir (a grader snapshot: link-free),
    files over MAX_SCAN_BYTES left out; {} when there is no directory."""
    texts = {}
    for path in code_files(code_dir, suffixes):
        if path.stat().st_size <= MAX_SCAN_BYTES:
            texts[path.relative_to(code_dir).as_posix()] = path.read_text(errors="replace")
    return texts


def _expression(text: str, start: int, limit: int = 60) -> str:
    """The expression starting at text[start]: up to a top-level comma, closing bracket or newline."""
    depth, quote, i = 0, None, start
    while i < len(text) and i - start < 200:
        char = text[i]
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif char == "\n" or (depth == 0 and char in ",#"):
            break
        i += 1
    value = text[start:i].strip()
    return value if len(value) <= limit else value[: limit - 3] + "..."


# A value that is only a type annotation (`max_steps: int` in a signature), not a setting.
_ANNOTATION = re.compile(r"^(?:int|float|str|bool|None|Optional\[.*\]|(?:int|float|str) \| None)$")
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_LORA_RANK = re.compile(r"\bLoraConfig\s*\([^)]*?(?<![\w.])r\s*=\s*")


def key_configuration(code_dir: Path | None) -> dict[str, str]:
    """The first value the code gives each of CONFIG_KEYS (as written, e.g. 'env_float("LR", 5e-4)');
    a bare name set at the start of a line elsewhere in the code shows that assignment too
    ("SFT_LR (= 2e-5)"); type annotations (`max_steps: int`) are not values."""
    found: dict[str, str] = {}
    text = _code_text(code_dir)
    for match in _CONFIG_ASSIGN.finditer(text):
        key = match.group(1)
        if key not in found:
            value = _expression(text, match.end())
            if value and not _ANNOTATION.match(value):
                found[key] = value
    lora = _LORA_RANK.search(text)  # peft's LoraConfig(r=...): the LoRA rank
    if lora and "lora_r" not in found:
        found["lora_r"] = _expression(text, lora.end())
    for key, value in found.items():
        if _IDENTIFIER.match(value) and value not in CONFIG_KEYS:
            assigned = re.search(rf"^{re.escape(value)}\s*(?::[^=\n]*)?=(?!=)\s*", text, re.M)
            if assigned:
                found[key] = f"{value} (= {_expression(text, assigned.end())})"
    return {key: found[key] for key in CONFIG_KEYS if key in found}


def config_line(line: str) -> bool:
    """A line that sets one of CONFIG_KEYS (not a signature's annotation such as `max_steps: int`)."""
    if re.match(r"\s*(?:async\s+)?def\s", line):
        return False
    for match in _CONFIG_ASSIGN.finditer(line):
        value = _expression(line, match.end())
        if value and not _ANNOTATION.match(value):
            return True
    return False


def code_line(text: str) -> str:
    """A line of code as summaries quote it: stripped, cut to KEY_LINE_MAX_CHARS."""
    line = text.strip()
    return line if len(line) <= KEY_LINE_MAX_CHARS else line[: KEY_LINE_MAX_CHARS - 3] + "..."
