"""Per-model decoding (generation.decoding): the model registry's `generation:` block, as the
reference's models.yaml decodes models on the tasks it scores through OpenCompass; and which
baseline Δ is computed against (evaluation.baseline_score)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.evaluation.evaluate import delta_baseline, noise_summary
from rlbench.generation import decoding
from rlbench.generation.backends import HFBackend
from rlbench.generation.chat_format import ChatFormat
from rlbench.models.spec import ModelPrepareError, load_spec, validate_spec
from rlbench.tasks import get_task
from rlbench.tasks.base import EvalContext
from rlbench.tasks.parts import SingleTurn

REPO = Path(__file__).resolve().parents[1]
def task(name: str):
    return get_task({"name": name, "module": name.replace("-", "_")})


QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 38912, "enable_thinking": True, "seed": 0}


def test_registry_entries_carry_the_references_decoding():
    """The reference's models.yaml (commit 471eb30), matched by name prefix: Qwen/Qwen3-8B covers
    Qwen3-8B-Base; Qwen2.5-7B-Instruct is greedy, up to 8,192 tokens; the offline models say nothing
    (greedy)."""
    assert load_spec(REPO / "config/models/qwen3-8b-base.yaml")["generation"] == QWEN3
    assert load_spec(REPO / "config/models/qwen2.5-7b-instruct.yaml")["generation"] == {"temperature": 0.0, "max_new_tokens": 8192}
    assert "generation" not in load_spec(REPO / "config/models/tiny.yaml")
    with pytest.raises(ModelPrepareError, match="generation"):
        validate_spec({"name": "x", "source": "tiny", "hf_id": "a/b", "generation": {"temperature": 0.6, "beams": 4}})
    with pytest.raises(ModelPrepareError, match="temperature"):
        validate_spec({"name": "x", "source": "tiny", "hf_id": "a/b", "generation": {"temperature": -1}})


def test_decoding_settings_for_each_backend():
    greedy = decoding.model_decoding(None)
    assert not decoding.is_sampled(greedy) and decoding.hf_sampling(greedy) == {"do_sample": False}
    assert decoding.vllm_sampling(greedy) == {"temperature": 0.0} and decoding.template_kwargs(greedy) == {}
    sampled = decoding.model_decoding(QWEN3)
    assert decoding.is_sampled(sampled)
    assert decoding.hf_sampling(sampled) == {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert decoding.vllm_sampling(sampled, replicate=2) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 2}
    assert decoding.template_kwargs(sampled) == {"enable_thinking": True}
    assert decoding.describe(sampled) == "sampled (temperature 0.6, top_p 0.95, top_k 20, thinking on, seed 0)"


def test_only_the_opencompass_tasks_take_the_models_decoding():
    """The reference applies models.yaml to gsm8k and humaneval (OpenCompass); its own loops
    (ALFWorld, WebShop, DeepSearchQA, AlpacaEval) decode at temperature 0 whatever the model."""
    for name in ("gsm8k", "humaneval"):
        opencompass = task(name)
        assert opencompass.decoding(QWEN3) == {**decoding.model_decoding(QWEN3), "source": "model registry"}
        assert opencompass.noise_repeats({"name": name}, opencompass.decoding(QWEN3)) == decoding.SAMPLED_REPEATS
        assert opencompass.noise_repeats({"name": name}, opencompass.decoding(None)) == 1
    for name in ("alfworld", "webshop", "deepsearchqa", "alpaca-eval"):
        own_loop = task(name)
        assert not decoding.is_sampled(own_loop.decoding(QWEN3)) and own_loop.decoding(QWEN3)["source"] == "task protocol"


def test_sampled_decoding_is_seeded_per_repeat(tiny_model):
    """Same seed and repeat: the same text; another repeat: other samples; greedy: unchanged."""
    chats = [[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}] for i in range(4)]
    sampled = decoding.model_decoding({"temperature": 1.0, "top_p": 1.0, "top_k": 0})

    def generate(decoding_settings, replicate=0):
        backend = HFBackend(tiny_model, batch_size=4, decoding=decoding_settings, replicate=replicate)
        return backend.generate_chat(chats, 12)

    greedy = generate(None)
    assert generate(decoding.model_decoding(None)) == greedy
    first = generate(sampled)
    assert generate(sampled) == first  # seeded
    assert first != greedy and generate(sampled, replicate=1) != first


def test_thinking_reaches_the_chat_template(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if enable_thinking is defined and enable_thinking %}<think>{% else %}<no-think>{% endif %}"
    )
    chat = [{"role": "user", "content": "hi"}]
    plain = ChatFormat.for_model(tokenizer)
    assert plain.render(chat) == "hi<no-think>"
    thinking = ChatFormat.for_model(tokenizer)
    thinking.extra = decoding.template_kwargs(decoding.model_decoding(QWEN3))
    assert thinking.render(chat) == "hi<think>" and thinking.record()["template_kwargs"] == {"enable_thinking": True}


class _Recorder:
    def __init__(self):
        self.limits = []

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        self.limits.append(max_new_tokens)
        return [""] * len(conversations)


def test_the_models_length_applies_where_the_dataset_config_sets_none(tmp_path):
    """HumanEval's OpenCompass config sets no max_out_len: the model's decides (38,912 for Qwen3);
    a sweep that shortens the length (max_new_tokens) still wins; GSM8K's config sets 512."""
    rows = [{"id": "a"}]
    for model_length, expected in ((True, 38912), (False, 64)):
        recorder = _Recorder()
        ctx = EvalContext(settings={}, model_dir=tmp_path, eval_dir=tmp_path, backend=recorder,
                          decoding=decoding.model_decoding(QWEN3))
        SingleTurn(lambda row: [{"role": "user", "content": "x"}], 64, model_length=model_length).run(rows, ctx)
        assert recorder.limits == [expected]
    humaneval = task("humaneval")
    assert humaneval.rollout({"name": "humaneval", "source": "offline"}).model_length
    assert not humaneval.rollout({"name": "humaneval", "source": "offline", "max_new_tokens": 64}).model_length
    assert not getattr(task("gsm8k").rollout({"name": "gsm8k", "source": "offline"}), "model_length")


def test_delta_uses_the_first_baseline_evaluation_unless_told_the_mean():
    """The paper reports some baselines as means of repeats (ALFWorld 4.85 = 6.5/134): the config
    chooses; the reference's single (first) evaluation is the default."""
    baseline = {"score": 4.48, "grader_noise": noise_summary([4.48, 5.22, 4.85]), "score_mean": 4.85}
    assert delta_baseline(baseline, {}) == (4.48, "first")
    assert delta_baseline(baseline, {"baseline_score": "first"}) == (4.48, "first")
    assert delta_baseline(baseline, {"baseline_score": "mean"}) == (4.85, "mean")
    with pytest.raises(ValueError, match="first, mean"):
        delta_baseline(baseline, {"baseline_score": "median"})
    with pytest.raises(ValueError, match="rerun evaluate_baseline"):
        delta_baseline({"score": 1.0}, {"baseline_score": "mean"})
