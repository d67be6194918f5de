"""Does the best submission descend from the base model? Its weights compared with the base's, tensor
by tensor (`compare_models`), and its configuration and tokenizer with the base's.

    report = compare_models(base_dir, candidate_dir)
    report["verdict"]   # "untouched copy" | "descends from the base" | "unrelated" | "undetermined"
    report["reason"]    # one line: why that verdict

How. Both directories are Hugging Face model directories. Their config.json give the architecture's
identity (`IDENTITY_KEYS`, read from a nested text_config where the top level lacks them); their
tokenizer files give the vocabulary (tokenizer.json's model vocabulary and added tokens, else
vocab.json and added_tokens.json, else tokenizer.model's bytes), related as "identical", "extends"
(every base token keeps its id; tokens were added), "different" or "unknown". The weights are read
from the *.safetensors files (never pickle weights) with safetensors' lazy reader: one tensor pair at a
time, in row blocks of at most BLOCK_ELEMENTS elements, each converted to float32, so memory holds
two blocks and their difference and never two models. Tensors are matched by name; for each pair of
the same shape (or, for an embedding or LM head resized for added tokens, the rows they share: a tensor
whose first dimension is each side's config vocab_size, the rest equal):

    relative_change = ||W_c - W_b|| / ||W_b||        cosine = <W_c, W_b> / (||W_c|| ||W_b||)

(sums of squares and products per block in float32, the blocks' sums added in double; an all-zero
pair has relative change 0 and cosine 1; a zero base tensor with a non-zero candidate, a freshly
initialised bias, and a tensor holding NaN or infinity have neither, say why in `undefined`
("zero_base", "non_finite") and are left out of the parameter shares below). `bit_identical` is the
same dtype, shape and bytes; `value_identical` the same values once in float32 (an fp32 copy of a
bf16 base).

Verdict, in this order:

- "unrelated": another architecture (any IDENTITY_KEYS value but vocab_size differs), another
  vocabulary (the tokenizers differ; or vocab_size differs and the tokenizers are not known to be
  identical or extended), no tensor in common, or fewer than DESCENDS_SHARE of the compared
  parameters in tensors whose cosine with the base is at least COSINE_THRESHOLD;
- "undetermined": the architecture and vocabulary match but the weights could not be compared
  (`comparable` false, `reason` says why: no safetensors files, an unreadable file, ...);
- "untouched copy": every base tensor is present, none extra, every one bit-identical;
- "descends from the base": the rest (same architecture, at least DESCENDS_SHARE of the compared
  parameters keep a cosine of at least COSINE_THRESHOLD).

Why these thresholds. Fine-tuning moves weights little relative to their norm: full-parameter SFT or RL
at the usual learning rates (1e-6 to 1e-4, a few epochs) changes a tensor by a relative 1e-4 to 1e-2,
cosine above 0.999; even runs that damage the model rarely pass a relative change of 0.3 (cosine about
0.95 when the norm is kept). Two independently initialised or independently trained matrices have a
cosine near 0 (about 1/sqrt(n) for n elements). A cosine of 0.9 (a relative change of about 0.45 at an
unchanged norm) lies far from both. Normalisation weights (initialised to ones) and biases (zeros) have
high cosines between unrelated models too, which is why the share is counted in parameters, not tensors:
they are a negligible part of a model's parameters. DESCENDS_SHARE 0.9 lets a model through whose LM head
(about 7% of a 7B model's parameters) or a few layers were re-initialised, and nothing that replaced
most of its weights.

"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from pathlib import Path

METHOD = "per-tensor relative change and cosine against the base (safetensors, streamed, float32)"
VERSION = 1

UNTOUCHED = "untouched copy"
DESCENDS = "descends from the base"
UNRELATED = "unrelated"
UNDETERMINED = "undetermined"

#: a tensor "keeps" the base's direction at this cosine or above
COSINE_THRESHOLD = 0.9
#: the share of the compared parameters that must keep it for "descends from the base"
DESCENDS_SHARE = 0.9
#: elements of one tensor read and compared at a time (per side): 32 Mi float32 = 128 MiB
BLOCK_ELEMENTS = 1 << 25
#: names listed per kind (missing, extra, shape changed) in the report
LISTED_NAMES = 20
#: config.json keys that name the architecture; any difference but vocab_size's makes another architecture
IDENTITY_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)
#: config.json is small; anything larger is not read
MAX_JSON_BYTES = 64 << 20


class _Unreadable(Exception):
    """A weight file that cannot be read (the comparison then says why)."""


def _read_json(path: Path) -> dict | None:
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def config_identity(model_dir: Path) -> dict | None:
    """The IDENTITY_KEYS of <model_dir>/config.json (a nested text_config fills the keys the top level
    lacks); None when there is no readable config.json."""
    config = _read_json(Path(model_dir) / "config.json")
    if config is None:
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    identity = {}
    for key in IDENTITY_KEYS:
        value = config.get(key, text.get(key))
        identity[key] = list(value) if isinstance(value, (list, tuple)) else value
    return identity


def _vocabulary(model_dir: Path) -> tuple[str, dict[str, int] | None, str | None]:
    """(source, token -> id, sha256 of the source's bytes when there is no token map)."""
    model_dir = Path(model_dir)
    tokenizer = _read_json(model_dir / "tokenizer.json")
    if tokenizer is not None:
        vocab: dict[str, int] = {}
        model = tokenizer.get("model") if isinstance(tokenizer.get("model"), dict) else {}
        raw = model.get("vocab")
        if isinstance(raw, dict):
            vocab.update({str(t): int(i) for t, i in raw.items() if isinstance(i, int)})
        elif isinstance(raw, list):  # Unigram: [[piece, score], ...], the id is the position
            vocab.update({str(entry[0]): i for i, entry in enumerate(raw) if isinstance(entry, list) and entry})
        for added in tokenizer.get("added_tokens") or []:
            if isinstance(added, dict) and isinstance(added.get("id"), int):
                vocab[str(added.get("content"))] = added["id"]
        return "tokenizer.json", vocab, None
    raw = _read_json(model_dir / "vocab.json")
    if raw is not None:
        vocab = {str(t): int(i) for t, i in raw.items() if isinstance(i, int)}
        added = _read_json(model_dir / "added_tokens.json") or {}
        vocab.update({str(t): int(i) for t, i in added.items() if isinstance(i, int)})
        return "vocab.json", vocab, None
    spm = model_dir / "tokenizer.model"
    if spm.is_file() and not spm.is_symlink():
        return "tokenizer.model", None, hashlib.sha256(spm.read_bytes()).hexdigest()
    return "none", None, None


def _vocab_sha256(vocab: dict[str, int]) -> str:
    return hashlib.sha256(json.dumps(sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))).encode()).hexdigest()


def compare_tokenizers(base_dir: Path, candidate_dir: Path) -> dict:
    """The two vocabularies: each side's source, size and sha256, and `relation`: "identical",
    "extends" (the candidate keeps every base token's id and adds some), "different" or "unknown"
    (a side has no tokenizer file we read, or they are of kinds that cannot be compared)."""
    sides = {}
    maps = {}
    for side, directory in (("base", base_dir), ("candidate", candidate_dir)):
        source, vocab, digest = _vocabulary(directory)
        maps[side] = vocab
        sides[side] = {
            "source": source,
            "size": len(vocab) if vocab is not None else None,
            "sha256": _vocab_sha256(vocab) if vocab is not None else digest,
        }
    base, candidate = maps["base"], maps["candidate"]
    if base is not None and candidate is not None:
        if base == candidate:
            relation = "identical"
        elif len(candidate) > len(base) and all(candidate.get(t) == i for t, i in base.items()):
            relation = "extends"
        else:
            relation = "different"
        changed = sum(1 for t, i in base.items() if candidate.get(t) != i)
        detail = {"base_tokens_moved_or_missing": changed, "added_tokens": sum(1 for t in candidate if t not in base)}
    elif sides["base"]["sha256"] and sides["base"]["source"] == sides["candidate"]["source"]:
        relation = "identical" if sides["base"]["sha256"] == sides["candidate"]["sha256"] else "different"
        detail = {}
    else:
        relation, detail = "unknown", {}
    return {**sides, "relation": relation, **detail}


def _weight_index(model_dir: Path) -> tuple[dict[str, Path], list[str]]:
    """name -> the *.safetensors file holding it (top level, name order; a name in two files counts once,
    the first); the problems met (links skipped)."""
    index: dict[str, Path] = {}
    problems = []
    from safetensors import safe_open

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        if path.is_symlink() or not path.is_file():
            problems.append(f"{path.name} is not a regular file (skipped)")
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    index.setdefault(name, path)
        except Exception as exc:  # noqa: BLE001 - a corrupt header: the file cannot be compared
            raise _Unreadable(f"{path.name} cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from exc
    return index, problems


class _Files:
    """Open safetensors readers, one per file, closed together."""

    def __init__(self):
        self._open: dict[Path, object] = {}

    def slice(self, path: Path, name: str):
        from safetensors import safe_open

        if path not in self._open:
            self._open[path] = safe_open(str(path), framework="pt").__enter__()
        return self._open[path].get_slice(name)

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()


def _dtype_name(dtype: str) -> str:
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(dtype, dtype.lower())


def _compare_pair(base_slice, candidate_slice, rows: int) -> dict:
    """Sums over the first `rows` rows of two tensors (all of a 0-d or 1-d tensor), block by block."""
    import torch

    shape_b = list(base_slice.get_shape())
    shape_c = list(candidate_slice.get_shape())
    same_dtype = base_slice.get_dtype() == candidate_slice.get_dtype()
    sums = {"bb": 0.0, "cc": 0.0, "bc": 0.0, "dd": 0.0}
    bit_identical = same_dtype and shape_b == shape_c
    value_identical = True
    finite = True
    if len(shape_b) <= 1:
        blocks = [None]
    else:
        per_row = max(1, math.prod(shape_b[1:]))
        step = max(1, BLOCK_ELEMENTS // per_row)
        blocks = [(start, min(rows, start + step)) for start in range(0, rows, step)]
    for block in blocks:
        if block is None:  # a scalar or a vector: whole (the rows they share, if resized)
            b, c = base_slice[...], candidate_slice[...]
            if shape_b:
                b, c = b[:rows], c[:rows]
        else:
            b, c = base_slice[block[0] : block[1]], candidate_slice[block[0] : block[1]]
        if bit_identical and not torch.equal(b, c):
            bit_identical = False
        b32, c32 = b.to(torch.float32).reshape(-1), c.to(torch.float32).reshape(-1)
        del b, c
        if value_identical and not torch.equal(b32, c32):
            value_identical = False
        d = c32 - b32
        partial = (torch.dot(b32, b32), torch.dot(c32, c32), torch.dot(b32, c32), torch.dot(d, d))
        for key, value in zip(("bb", "cc", "bc", "dd"), partial):
            value = float(value)
            if not math.isfinite(value):
                finite = False
            sums[key] += value
        del b32, c32, d
    return {**sums, "bit_identical": bit_identical, "value_identical": value_identical, "finite": finite}


def _measures(sums: dict) -> tuple[float | None, float | None, str | None]:
    """(relative change, cosine, why they are None): "non_finite" (a NaN or infinity in a tensor or a
    sum) or "zero_base" (the base tensor is all zeros, the candidate's is not: a freshly initialised
    bias, no direction to compare)."""
    if not sums["finite"]:
        return None, None, "non_finite"
    if sums["value_identical"]:
        return 0.0, 1.0, None
    nb, nc = math.sqrt(sums["bb"]), math.sqrt(sums["cc"])
    if nb == 0.0:
        return (0.0, 1.0, None) if nc == 0.0 else (None, None, "zero_base")
    relative = math.sqrt(sums["dd"]) / nb
    cosine = sums["bc"] / (nb * nc) if nc > 0.0 else 0.0
    return relative, max(-1.0, min(1.0, cosine)), None


def compare_weights(base_dir: Path, candidate_dir: Path, vocab_sizes: tuple = (None, None)) -> dict:
    """The per-tensor comparison (see the module docstring): `tensors` (counts and the first names of
    each kind), `per_tensor`, `parameters` and `summary`. `vocab_sizes`: the configs' vocab_size (base,
    candidate), the first dimension of a tensor that may be resized. Raises _Unreadable when a side's
    weights cannot be read at all."""
    base_index, base_problems = _weight_index(base_dir)
    cand_index, cand_problems = _weight_index(candidate_dir)
    if not base_index:
        raise _Unreadable("the base model has no safetensors weights")
    if not cand_index:
        raise _Unreadable("the submission has no safetensors weights (pickle weights are never loaded)")
    files = _Files()
    per_tensor = []
    shape_changed, missing = [], []
    try:
        for name in sorted(base_index):
            if name not in cand_index:
                missing.append(name)
                continue
            try:
                bs = files.slice(base_index[name], name)
                cs = files.slice(cand_index[name], name)
                shape_b, shape_c = list(bs.get_shape()), list(cs.get_shape())
            except Exception as exc:  # noqa: BLE001
                raise _Unreadable(f"tensor {name} cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from exc
            resized = False
            if shape_b != shape_c:
                # An embedding or LM head resized for added (or trimmed) tokens: compare the rows they share.
                if (
                    len(shape_b) == len(shape_c) >= 1
                    and shape_b[1:] == shape_c[1:]
                    and (shape_b[0], shape_c[0]) == tuple(vocab_sizes)
                ):
                    resized = True
                else:
                    shape_changed.append(name)
                    continue
            rows = min(shape_b[0], shape_c[0]) if shape_b else 0
            try:
                sums = _compare_pair(bs, cs, rows)
            except Exception as exc:  # noqa: BLE001
                raise _Unreadable(f"tensor {name} cannot be compared: {type(exc).__name__}: {str(exc)[:200]}") from exc
            relative, cosine, undefined = _measures(sums)
            compared = (rows * math.prod(shape_b[1:])) if len(shape_b) >= 1 else 1
            per_tensor.append(
                {
                    "name": name,
                    "shape": shape_b,
                    "candidate_shape": shape_c if resized else None,
                    "dtype": _dtype_name(bs.get_dtype()),
                    "candidate_dtype": _dtype_name(cs.get_dtype()),
                    "parameters": int(compared),
                    "relative_change": relative,
                    "cosine": cosine,
                    "undefined": undefined,
                    "bit_identical": bool(sums["bit_identical"] and not resized),
                    "value_identical": bool(sums["value_identical"] and not resized),
                }
            )
    finally:
        files.close()
    extra = sorted(set(cand_index) - set(base_index))
    compared = len(per_tensor)
    # Tensors without a cosine (zero base, non-finite) are left out of the share, and counted.
    params = sum(t["parameters"] for t in per_tensor if t["cosine"] is not None)
    high = [t for t in per_tensor if t["cosine"] is not None and t["cosine"] >= COSINE_THRESHOLD]
    high_params = sum(t["parameters"] for t in high)
    relatives = [t["relative_change"] for t in per_tensor if t["relative_change"] is not None]
    cosines = [t for t in per_tensor if t["cosine"] is not None]
    worst_relative = max(per_tensor, key=lambda t: -1 if t["relative_change"] is None else t["relative_change"], default=None)
    worst_cosine = min(cosines, key=lambda t: t["cosine"], default=None)
    summary = {
        "median_relative_change": statistics.median(relatives) if relatives else None,
        "max_relative_change": max(relatives) if relatives else None,
        "max_relative_change_tensor": worst_relative["name"] if worst_relative and relatives else None,
        "min_cosine": worst_cosine["cosine"] if worst_cosine else None,
        "min_cosine_tensor": worst_cosine["name"] if worst_cosine else None,
        "unchanged_share": sum(t["bit_identical"] for t in per_tensor) / compared if compared else None,
        "value_identical_share": sum(t["value_identical"] for t in per_tensor) / compared if compared else None,
        "high_cosine_share": high_params / params if params else None,
        "high_cosine_tensor_share": len(high) / compared if compared else None,
    }
    return {
        "tensors": {
            "base": len(base_index),
            "candidate": len(cand_index),
            "compared": compared,
            "missing": len(missing),
            "extra": len(extra),
            "shape_changed": len(shape_changed),
            "resized": sum(1 for t in per_tensor if t["candidate_shape"] is not None),
            "bit_identical": sum(t["bit_identical"] for t in per_tensor),
            "value_identical": sum(t["value_identical"] for t in per_tensor),
            "non_finite": sum(1 for t in per_tensor if t["undefined"] == "non_finite"),
            "zero_base": sum(1 for t in per_tensor if t["undefined"] == "zero_base"),
            "missing_names": missing[:LISTED_NAMES],
            "extra_names": extra[:LISTED_NAMES],
            "shape_changed_names": shape_changed[:LISTED_NAMES],
        },
        "parameters": {"compared": int(params), "high_cosine": int(high_params)},
        "summary": summary,
        "per_tensor": per_tensor,
        "problems": base_problems + cand_problems,
    }


def _identity_differences(base: dict | None, candidate: dict | None) -> list[str]:
    if base is None or candidate is None:
        return []
    return [key for key in IDENTITY_KEYS if base.get(key) != candidate.get(key)]


def _fmt(value) -> str:
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)


def compare_models(base_dir: Path, candidate_dir: Path) -> dict:
    """The lineage report of a submission (candidate_dir) against the base model (base_dir); JSON-able.

    Fields: method, version, base, candidate (the directories), verdict, reason, comparable (the
    weights were compared), config {base, candidate, differences, same_architecture}, tokenizer
    (compare_tokenizers), thresholds {cosine, share}, and, when the weights were compared, tensors
    {base, candidate, compared, missing, extra, shape_changed, resized, bit_identical, value_identical,
    non_finite, zero_base, missing_names, extra_names, shape_changed_names}, parameters {compared, high_cosine},
    summary {median_relative_change, max_relative_change, max_relative_change_tensor, min_cosine,
    min_cosine_tensor, unchanged_share, value_identical_share, high_cosine_share,
    high_cosine_tensor_share}, per_tensor [{name, shape, candidate_shape, dtype, candidate_dtype,
    parameters, relative_change, cosine, undefined, bit_identical, value_identical}], problems; elapsed_s."""
    started = time.monotonic()
    base_dir, candidate_dir = Path(base_dir), Path(candidate_dir)
    base_id, cand_id = config_identity(base_dir), config_identity(candidate_dir)
    differences = _identity_differences(base_id, cand_id)
    architecture = [key for key in differences if key != "vocab_size"]
    tokenizer = compare_tokenizers(base_dir, candidate_dir)
    report: dict = {
        "method": METHOD,
        "version": VERSION,
        "base": str(base_dir),
        "candidate": str(candidate_dir),
        "verdict": None,
        "reason": None,
        "comparable": False,
        "config": {
            "base": base_id,
            "candidate": cand_id,
            "differences": differences,
            "same_architecture": None if base_id is None or cand_id is None else not architecture,
        },
        "tokenizer": tokenizer,
        "thresholds": {"cosine": COSINE_THRESHOLD, "share": DESCENDS_SHARE},
    }
    why_not = None
    try:
        vocab_sizes = ((base_id or {}).get("vocab_size"), (cand_id or {}).get("vocab_size"))
        weights = compare_weights(base_dir, candidate_dir, vocab_sizes)
        report["comparable"] = True
        report.update(weights)
    except _Unreadable as exc:
        why_not = str(exc)
    report["verdict"], report["reason"] = _verdict(report, architecture, why_not)
    report["elapsed_s"] = round(time.monotonic() - started, 3)
    return report


def _verdict(report: dict, architecture: list[str], why_not: str | None) -> tuple[str, str]:
    base_id, cand_id = report["config"]["base"], report["config"]["candidate"]
    tokenizer = report["tokenizer"]
    if architecture:
        shown = ", ".join(f"{k} {_fmt(base_id.get(k))} vs {_fmt(cand_id.get(k))}" for k in architecture)
        return UNRELATED, f"another architecture ({shown})"
    if tokenizer["relation"] == "different":
        moved = tokenizer.get("base_tokens_moved_or_missing")
        detail = f": {moved} of the base's {tokenizer['base']['size']} tokens moved or missing" if moved else ""
        return UNRELATED, f"another vocabulary ({tokenizer['candidate']['source']} differs{detail})"
    if "vocab_size" in report["config"]["differences"] and tokenizer["relation"] not in ("identical", "extends"):
        return UNRELATED, (
            f"another vocabulary (vocab_size {base_id.get('vocab_size')} vs {cand_id.get('vocab_size')}, "
            f"tokenizers {tokenizer['relation']})"
        )
    if why_not is not None:
        config = "" if base_id and cand_id else (" and the configuration could not be read" if cand_id is None else "")
        return UNDETERMINED, f"the weights could not be compared: {why_not}{config}"
    tensors, summary = report["tensors"], report["summary"]
    if not tensors["compared"]:
        return UNRELATED, "no tensor name in common with the base" + (
            f" ({tensors['shape_changed']} of another shape)" if tensors["shape_changed"] else ""
        )
    if (
        tensors["bit_identical"] == tensors["compared"] == tensors["base"]
        and not tensors["extra"]
        and not tensors["resized"]
    ):
        return UNTOUCHED, f"all {tensors['compared']} tensors are bit-identical to the base's"
    share = summary["high_cosine_share"] or 0.0
    kept = f"{share:.1%} of the compared parameters keep a cosine >= {COSINE_THRESHOLD} with the base"
    if share < DESCENDS_SHARE:
        return UNRELATED, f"only {kept} (min cosine {summary['min_cosine']:.3g} in {summary['min_cosine_tensor']})"
    notes = []
    for key, label in (("missing", "missing"), ("extra", "extra"), ("shape_changed", "of another shape")):
        if tensors[key]:
            notes.append(f"{tensors[key]} tensors {label}")
    return DESCENDS, f"{kept}; median relative change {summary['median_relative_change']:.3g}" + (
        f" ({', '.join(notes)})" if notes else ""
    )
