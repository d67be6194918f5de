"""Dataset configs of the OpenCompass wheel, read as data: the paper's evaluation protocols.

The paper scores L1 tasks through OpenCompass. Its dataset config files hold the exact prompt
templates (few-shot exemplars included), generation lengths and post-processor names. We read
them from the pinned, installed wheel (`pip install --no-deps opencompass==0.5.1`, done by
`make setup`) instead of copying their text into this repository, and we never import
OpenCompass itself (its dependency tree is large and not needed): the file is parsed with `ast`
and only literal values and names are kept.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
from pathlib import Path

PACKAGE = "opencompass"
VERSION = "0.5.1"  # the version the reference harness pins (RD-Agent autorl_bench/requirements.txt)
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={VERSION}  (`make setup` does this)"


class ProtocolUnavailable(RuntimeError):
    """The pinned OpenCompass wheel is missing or differs from what the protocol was written for."""


def _package_root() -> Path:
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ProtocolUnavailable(f"the evaluation protocol comes from {PACKAGE}=={VERSION}, which is not installed: {INSTALL_HINT}") from None
    if dist.version != VERSION:
        raise ProtocolUnavailable(f"{PACKAGE} {dist.version} is installed but the protocol is pinned to {VERSION}: {INSTALL_HINT}")
    return Path(dist.locate_file(PACKAGE))


def config_file(relative: str) -> Path:
    """The path of a file inside the installed package, e.g. 'configs/datasets/gsm8k/gsm8k_gen_1d7fe4.py'."""
    path = _package_root() / relative
    if not path.is_file():
        raise ProtocolUnavailable(f"{relative} is missing from the installed {PACKAGE} {VERSION}: reinstall it: {INSTALL_HINT}")
    return path


class _Literal(ast.NodeVisitor):
    """Evaluates the config's literal subset: dict(...) calls, lists, constants; names stay names."""

    def __init__(self, scope: dict):
        self.scope = scope

    def value(self, node: ast.AST):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(item) for item in node.elts]
        if isinstance(node, ast.Dict):
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
            return {kw.arg: self.value(kw.value) for kw in node.keywords}
        if isinstance(node, ast.Name):
            # An imported class or function (PromptTemplate, gsm8k_postprocess) is kept by name.
            return self.scope.get(node.id, node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left) + self.value(node.right)
        raise ValueError(f"unsupported expression in an OpenCompass config: {ast.dump(node)[:80]}")


def read_dataset_config(relative: str) -> dict:
    """The module-level assignments of a dataset config file, as plain data, plus its source."""
    path = config_file(relative)
    text = path.read_text(encoding="utf-8")
    scope: dict = {}
    evaluator = _Literal(scope)
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            scope[node.targets[0].id] = evaluator.value(node.value)
    scope["__source__"] = {
        "package": PACKAGE,
        "version": VERSION,
        "file": relative,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    return scope
