"""The ``hub`` source: ``huggingface_hub.snapshot_download`` of a repository's safetensors weights and
tokenizer files (a repository with pickle-based weights only is refused before anything is downloaded).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rlbench.models.model_dir import ALLOWED_PATTERNS, FORBIDDEN_WEIGHT_PATTERNS, matches
from rlbench.models.spec import ModelPrepareError


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


def build_hub(spec: dict, out: Path) -> dict:
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
            if any(matches(f, FORBIDDEN_WEIGHT_PATTERNS) for f in files):
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


def _remove_matching(root: Path, patterns: tuple[str, ...]) -> None:
    for item in list(root.rglob("*")):
        if item.is_file() and matches(item.name, patterns):
            item.unlink()
