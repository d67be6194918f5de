"""The GPUs a submission is evaluated on: the ids a request names, checked, and one lock per GPU."""

from __future__ import annotations

import threading

from rlbench.grader.submission import SHOWN_PATH_CHARS, SubmissionRefused
from rlbench.recording.ledger import safe_text


def gpu_order(gpu: str) -> tuple:
    """Sort key for GPU ids: numeric ids by value ("2" before "10"), then any other id (UUIDs)."""
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def requested_gpus(value: object, available: list[str]) -> list[str]:
    """The GPU ids a request's "gpu" names ("0", "2,3", 1), each one checked against `available`.

    As the reference grader: a comma-separated list of ids, every one of which must be among the
    GPUs the grader was given (CUDA_VISIBLE_DEVICES); a grader without GPUs refuses any value.
    """
    choices = sorted(available, key=gpu_order)
    hint = (
        f'available GPUs: {", ".join(choices)} (GET $GRADING_SERVER_URL/health lists them); '
        'omit "gpu" to use the first one'
        if choices
        else 'this grader has no GPUs (CUDA_VISIBLE_DEVICES is empty): omit "gpu" from the request'
    )
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SubmissionRefused(400, "invalid_gpu", f'"gpu" must be a string of GPU ids such as "0" or "0,1"; {hint}')
    ids: list[str] = []
    for part in str(value).split(","):
        if part.strip() and part.strip() not in ids:
            ids.append(part.strip())
    if not ids:
        raise SubmissionRefused(400, "invalid_gpu", f'"gpu" is empty; {hint}')
    unknown = [g for g in ids if g not in available]
    if unknown:
        listed = safe_text(", ".join(unknown), SHOWN_PATH_CHARS)
        raise SubmissionRefused(400, "invalid_gpu", f"GPU {listed} not available; {hint}")
    return ids


class GpuLocks:
    """The grader's GPUs (CUDA_VISIBLE_DEVICES as it sees them, in gpu_order) and one lock per GPU,
    or a single "cpu" lock for a grader without GPUs: evaluations on the same GPU take turns."""

    def __init__(self, gpus: list[str]):
        self.available = sorted(gpus, key=gpu_order)
        self.locks = {gpu: threading.Lock() for gpu in self.available or ["cpu"]}

    def for_request(self, requested: object) -> list[str]:
        """The GPUs an evaluation may use: those requested (checked), else the first available."""
        if requested is None:
            return self.available[:1]
        return requested_gpus(requested, self.available)

    def locks_for(self, gpus: list[str]) -> list[threading.Lock]:
        """One lock per GPU, always taken in the same order, so multi-GPU requests never deadlock."""
        return [self.locks[g] for g in sorted(gpus, key=gpu_order)] or [self.locks["cpu"]]
