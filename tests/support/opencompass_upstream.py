"""OpenCompass's own prompt rendering and GSM8K post-processing, loaded from the pinned wheel.

OpenCompass's package __init__ files import its whole evaluation stack (dozens of heavy
dependencies). The tests need only a few of its modules, so this loader registers the
packages as empty shells pointing at the installed files and imports just those modules, as
OpenCompass itself would run them. Needs `make setup` (opencompass and mmengine-lite, no deps).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
import types
from pathlib import Path


def _shell(name: str, path: Path | None = None, **attrs) -> types.ModuleType:
    module = sys.modules.get(name) or types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def load() -> types.SimpleNamespace:
    root = Path(importlib.metadata.distribution("opencompass").locate_file("opencompass"))
    _shell("opencompass", root)
    _shell("opencompass.utils", root / "utils", get_logger=logging.getLogger, get_data_path=lambda path: path)
    _shell("opencompass.models", root / "models")
    _shell("opencompass.openicl", root / "openicl", BaseEvaluator=object)
    _shell("opencompass.datasets", root / "datasets")
    _shell("opencompass.datasets.base", BaseDataset=object)
    prompt_template = importlib.import_module("opencompass.openicl.icl_prompt_template")
    chat_model = importlib.import_module("opencompass.models.huggingface_above_v4_33")
    gsm8k = importlib.import_module("opencompass.datasets.gsm8k")
    postprocessors = importlib.import_module("opencompass.utils.text_postprocessors")
    return types.SimpleNamespace(
        root=root,
        PromptTemplate=prompt_template.PromptTemplate,
        convert_chat_messages=chat_model._convert_chat_messages,
        chat_template_parser=chat_model._get_meta_template,
        gsm8k_postprocess=gsm8k.gsm8k_postprocess,
        gsm8k_dataset_postprocess=gsm8k.gsm8k_dataset_postprocess,
        Gsm8kEvaluator=gsm8k.Gsm8kEvaluator,
        extract_non_reasoning_content=postprocessors.extract_non_reasoning_content,
    )


def execute_config(path: Path, upstream: types.SimpleNamespace) -> dict:
    """Run a dataset config file as Python, as OpenCompass does, with its imports resolved."""
    names = {
        "PromptTemplate": upstream.PromptTemplate,
        "gsm8k_postprocess": upstream.gsm8k_postprocess,
        "gsm8k_dataset_postprocess": upstream.gsm8k_dataset_postprocess,
        "Gsm8kEvaluator": upstream.Gsm8kEvaluator,
    }
    scope: dict = {}
    source = path.read_text()
    # The import lines name classes we do not load (retrievers, inferencers, the dataset loader):
    # bind every imported name, using the real object where we have one.
    for line in source.splitlines():
        if line.startswith("from opencompass"):
            for name in line.split(" import ", 1)[1].split(","):
                name = name.strip()
                scope[name] = names.get(name, name)
    body = "\n".join(line for line in source.splitlines() if not line.startswith("from opencompass"))
    exec(compile(body, str(path), "exec"), scope)
    return scope


def render_chat(upstream: types.SimpleNamespace, template: dict, row: dict, output_column: str) -> list[dict]:
    """The messages OpenCompass's chat models send for one row: PromptTemplate -> parser -> chat."""
    prompt_template = upstream.PromptTemplate(template=template)
    item = prompt_template.generate_item(
        row, output_field=output_column, output_field_replace_token="", ice_field_replace_token=""
    )
    parsed = upstream.chat_template_parser(None).parse_template(item, mode="gen")
    return upstream.convert_chat_messages([parsed])[0]
