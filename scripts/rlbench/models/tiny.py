"""The ``tiny`` source: a seeded random ``Qwen2ForCausalLM`` (~0.14 M parameters) built from the committed
tokenizer ``assets/tiny_tokenizer.json`` and TRL's tool-capable ``assets/qwen2_5.jinja`` chat template.
Byte-for-byte deterministic: the same seed gives identical safetensors.

``assets/qwen2_5.jinja`` is a byte-identical copy of ``trl/chat_templates/qwen2_5.jinja``
(TRL, Apache-2.0; the file carries no header of its own). It must stay byte-identical: TRL
recognises templates by exact comparison to attach its tool-call response parser.
``build_tiny_tokenizer`` regenerates the tokenizer asset
(``PYTHONPATH=scripts python -m rlbench.models.materialise build-tokenizer``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from rlbench.models.spec import ModelPrepareError
from rlbench.paths import ASSETS_DIR

TINY_TOKENIZER_PATH = ASSETS_DIR / "tiny_tokenizer.json"
TINY_CHAT_TEMPLATE_PATH = ASSETS_DIR / "qwen2_5.jinja"

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

# Room for the few-shot GSM8K prompt (about 2.2k tokens of the byte-level tokenizer).
TINY_MAX_POSITIONS = 4096


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


def build_tiny(spec: dict, out: Path) -> dict:
    """Write the seeded random tiny Qwen2 model (float32) with the committed tokenizer."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if not TINY_TOKENIZER_PATH.is_file():
        raise ModelPrepareError(
            f"missing {TINY_TOKENIZER_PATH}; regenerate it with "
            "`PYTHONPATH=scripts python -m rlbench.models.materialise build-tokenizer`"
        )
    seed = int(spec["seed"])
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
