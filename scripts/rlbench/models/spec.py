"""A model registry entry (config/models/<name>.yaml), read and validated against
workflow/schemas/model.schema.yaml through rlbench.config (the schema's defaults filled in), and
ModelPrepareError, what every step of materialising a model raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlbench.config import ConfigError, registry_entry


class ModelPrepareError(Exception):
    """A model could not be materialised; the message says what the user should do."""


def load_spec(path: Path) -> dict:
    """Read one registry YAML file and return the validated entry.

    Promises: the returned dict is :func:`validate_spec`'s (defaults filled in) and its ``name`` equals the
    file stem.
    """
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelPrepareError(f"cannot read model registry entry {path}: {exc}") from exc
    spec = validate_spec(spec)
    if spec["name"] != path.stem:
        raise ModelPrepareError(
            f"{path}: name {spec['name']!r} must equal the file stem {path.stem!r}; rename one of them"
        )
    return spec


def validate_spec(spec: Any) -> dict:
    """The registry entry checked against the model schema, with the schema's defaults filled in (those of
    its source, e.g. a tiny model's seed); raises :class:`ModelPrepareError` naming the offending key and
    what is allowed when it is unusable."""
    name = spec.get("name", "?") if isinstance(spec, dict) else "?"
    try:
        return registry_entry("models", spec, f"model registry entry {name!r}")
    except ConfigError as exc:
        raise ModelPrepareError(str(exc)) from None
