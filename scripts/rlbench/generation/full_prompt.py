"""The reference text generator (FullPromptGenerator): the reference harness's way, one prompt at
a time, the whole prompt computed at every call (transformers ``generate``, batch 1)."""

from __future__ import annotations

import time
from pathlib import Path

from rlbench.generation.backends import cut_at_stop
from rlbench.generation.textgen_base import HFModel, TextGenerator, contains_stop, new_stats


class FullPromptGenerator(TextGenerator):
    """The reference harness's way: each prompt alone (batch 1), the whole prompt computed at every
    call, transformers ``generate`` with greedy decoding."""

    name = "reference"

    def __init__(self, model_dir: Path, device: str | None = None, dtype=None):
        self.hf = HFModel(model_dir, device=device, dtype=dtype)
        self.stats = new_stats()

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

        torch, hf = self.hf.torch, self.hf
        started = time.perf_counter()
        stats = self.stats
        stats["calls"] += 1
        results = {}
        for key, prompt in prompts.items():
            ids = hf.encode(prompt)
            stats["prompts"] += 1
            stats["prompt_tokens"] += len(ids)
            if not hf.fits(len(ids), max_new_tokens):
                stats["over_context"] += 1
                results[key] = None
                continue

            class _StopText(StoppingCriteria):  # the same rule as CachedBatchGenerator (and vLLM)
                def __call__(self, input_ids, scores, **kwargs):
                    done = contains_stop(hf.decode(input_ids[0, len(ids) :].tolist()), stop)
                    return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

            config = GenerationConfig(  # a clean greedy config: nothing from the model's defaults
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(hf.eos) or None,
                pad_token_id=hf.pad_id,
            )
            inputs = torch.tensor([ids], device=hf.device)
            with torch.inference_mode():
                output = hf.model.generate(
                    input_ids=inputs,
                    attention_mask=torch.ones_like(inputs),
                    generation_config=config,
                    stopping_criteria=StoppingCriteriaList([_StopText()]) if stop else None,
                )
            new = output[0, len(ids) :].tolist()
            stats["prompt_tokens_computed"] += len(ids)
            stats["generated_tokens"] += len(new)
            stats["forward_calls"] += len(new)
            results[key] = cut_at_stop(hf.decode(new), stop)
        stats["generate_seconds"] += time.perf_counter() - started
        return results
