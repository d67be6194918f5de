"""Sweep configuration and the task / model / agent registries, validated with clear errors.

Builds on: paths.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from rlbench.paths import CONFIG_DIR, SCHEMA_DIR

REGISTRY_KINDS = ("tasks", "models", "agents")
_SCHEMA_FOR_KIND = {"tasks": "task", "models": "model", "agents": "agent"}


class ConfigError(ValueError):
    """A configuration or registry problem the user must fix; the message says how."""


def load_yaml(path: Path) -> Any:
    try:
        with open(path) as handle:
            return yaml.safe_load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_schema(name: str) -> dict:
    return load_yaml(SCHEMA_DIR / f"{name}.schema.yaml")


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = []
    for part in error.absolute_path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".") or "<top level>"


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator in ("oneOf", "anyOf") and error.context:
        # Explain the alternative the value was meant as, not that it fits neither.
        meant = [e for e in error.context if e.validator != "type"] or error.context
        return _describe(min(meant, key=lambda e: len(list(e.absolute_path))))
    key = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = "" if key == "<top level>" else f" under '{key}'"
        return f"unknown key {', '.join(repr(k) for k in extra)}{where}; allowed keys: {', '.join(allowed)}"
    if error.validator == "enum":
        allowed = ", ".join(str(v) for v in error.validator_value)
        return f"'{key}' is {error.instance!r}; allowed values: {allowed}"
    if error.validator == "required":
        return f"'{key}' is missing a required key: {error.message}"
    return f"'{key}': {error.message}"


def validate(instance: Any, schema: dict, what: str) -> None:
    """Raise ConfigError naming the offending key and what is allowed."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        lines = "\n  ".join(_describe(e) for e in errors)
        raise ConfigError(f"invalid {what}:\n  {lines}")


def _fill_defaults(instance: dict, schema: dict) -> None:
    """Set schema defaults on nested objects (jsonschema validates but never fills), and those of an `allOf`
    branch whose `if` the instance matches (a default for one kind of entry only, e.g. a tiny model's seed)."""
    for key, sub in schema.get("properties", {}).items():
        if "default" in sub and key not in instance:
            instance[key] = copy.deepcopy(sub["default"])
        if sub.get("type") == "object" and isinstance(instance.get(key), dict):
            _fill_defaults(instance[key], sub)
    for branch in schema.get("allOf", []):
        if "if" in branch and "then" in branch and jsonschema.Draft202012Validator(branch["if"]).is_valid(instance):
            _fill_defaults(instance, branch["then"])


def canonical(value: Any) -> Any:
    """value with every mapping's keys in sorted order (lists keep theirs). Rule params are compared
    by their text between runs: without this, reordering keys in a YAML file, or writing out a
    default, would look like a changed setting and rerun agents."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list):
        return [canonical(item) for item in value]
    return value


def _merged(base: dict, override: dict) -> dict:
    """base with override's keys on top; nested objects merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve_extends(raw: dict[str, dict], paths: dict[str, Path]) -> dict[str, dict]:
    """Entries with `extends: <name>` merged onto that entry (chains allowed, cycles refused)."""
    resolved: dict[str, dict] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> dict:
        if name in resolved:
            return resolved[name]
        entry = raw[name]
        parent = entry.get("extends") if isinstance(entry, dict) else None
        if parent is not None:
            if parent not in raw:
                raise ConfigError(
                    f"{paths[name]}: extends {parent!r}, which is not in {paths[name].parent}/; "
                    f"allowed: {', '.join(sorted(n for n in raw if n != name))}"
                )
            if parent in seen:
                raise ConfigError(f"{paths[name]}: extends forms a cycle: {' -> '.join((*seen, name, parent))}")
            base = {k: v for k, v in resolve(parent, (*seen, name)).items() if k not in ("description", "extends")}
            entry = _merged(base, entry)
        resolved[name] = entry
        return entry

    for name in raw:
        resolve(name, ())
    return resolved


def load_registry(kind: str, config_dir: Path = CONFIG_DIR) -> dict[str, dict]:
    """All entries of one registry (config/<kind>/*.yaml), keyed by name, each validated.

    An entry may start from another with `extends: <name>` (its keys override; objects merge)."""
    if kind not in REGISTRY_KINDS:
        raise ConfigError(f"unknown registry {kind!r}; allowed: {', '.join(REGISTRY_KINDS)}")
    schema = load_schema(_SCHEMA_FOR_KIND[kind])
    raw: dict[str, dict] = {}
    paths: dict[str, Path] = {}
    for path in sorted((config_dir / kind).glob("*.yaml")):
        raw[path.stem] = load_yaml(path)
        paths[path.stem] = path
    if "extends" in schema.get("properties", {}):
        raw = _resolve_extends(raw, paths)
    entries: dict[str, dict] = {}
    for name, entry in raw.items():
        path = paths[name]
        validate(entry, schema, f"registry entry {path}")
        if entry["name"] != path.stem:
            raise ConfigError(f"{path}: name {entry['name']!r} must equal the file name {path.stem!r}")
        _fill_defaults(entry, schema)
        entries[entry["name"]] = entry
    return {name: canonical(entry) for name, entry in entries.items()}


def registry_entry(kind: str, entry: Any, what: str) -> dict:
    """One registry entry that comes from elsewhere than config/<kind>/ (a file of its own, or one built in
    code), validated against its kind's schema and with the schema's defaults filled in, as load_registry
    gives each entry. Raises ConfigError naming the offending key and what is allowed (`what` names the entry)."""
    if kind not in REGISTRY_KINDS:
        raise ConfigError(f"unknown registry {kind!r}; allowed: {', '.join(REGISTRY_KINDS)}")
    schema = load_schema(_SCHEMA_FOR_KIND[kind])
    validate(entry, schema, what)
    entry = copy.deepcopy(entry)
    _fill_defaults(entry, schema)
    return canonical(entry)


@dataclass(frozen=True)
class Registries:
    tasks: dict[str, dict]
    models: dict[str, dict]
    agents: dict[str, dict]

    @classmethod
    def load(cls, config_dir: Path = CONFIG_DIR) -> "Registries":
        return cls(*(load_registry(kind, config_dir) for kind in REGISTRY_KINDS))


def section_settings(section: str, value: dict | None = None) -> dict:
    """One top-level block of the sweep config (`evaluation:`, `report:`, ...) validated against its part of the
    config schema, with the schema's defaults filled in: what code that runs outside the validated config reads,
    so that no default is written anywhere but the schema. Raises ConfigError on a block the schema refuses."""
    schema = load_schema("config")["properties"][section]
    settings = copy.deepcopy(value or {})
    validate(settings, schema, f"{section} settings")
    _fill_defaults(settings, schema)
    return settings


def evaluation_settings(evaluation: dict | None = None) -> dict:
    """The `evaluation:` block every evaluation reads (the grader's, the baseline's, the final one)."""
    return section_settings("evaluation", evaluation)


def grader_settings(grader: dict | None = None) -> dict:
    """The `grader:` block run_agent reads (checkpoint size bound, free-space reserve)."""
    return section_settings("grader", grader)


def report_settings(report: dict | None = None) -> dict:
    """The `report:` block the analysis stage reads (decimals, budget cuts, pass@k, bootstrap, narrative)."""
    return section_settings("report", report)


def validate_config(
    config: dict, registries: Registries, task_problems: Callable[[dict], list[str]] | None = None
) -> dict:
    """Validate a sweep config against the schema and the registries; return it with defaults.

    task_problems: what is wrong with one task's settings (the registry entry with the sweep's overrides)
    beyond the schema, asked for every task of the sweep: the workflow passes rlbench.tasks.split_size_problems
    (split sizes its data source cannot give), which this layer cannot import. Every problem is reported at once."""
    schema = load_schema("config")
    validate(config, schema, "config")
    config = copy.deepcopy(config)
    _fill_defaults(config, schema)
    problems = []
    grids = sweep_grids(config)
    for number, grid in enumerate(grids):
        where = "sweep" if isinstance(config["sweep"], dict) else f"sweep[{number}]"
        for kind in REGISTRY_KINDS:
            known = getattr(registries, kind)
            for index, name in enumerate(grid[kind]):
                if name not in known:
                    problems.append(
                        f"'{where}.{kind}[{index}]' is {name!r}, which is not in config/{kind}/; "
                        f"allowed values: {', '.join(sorted(known)) or '(none registered)'}"
                    )
    problems += _multi_grid_problems(config, grids)
    if MULTI_DIR in registries.tasks:  # results/runs/multi/ holds the multi-task runs
        problems.append(f"config/tasks/{MULTI_DIR}.yaml: the task name {MULTI_DIR!r} is reserved for multi-task runs; rename it")
    task_schema = load_schema("task")
    invalid = set()
    for name in config.get("tasks", {}):
        if name not in registries.tasks:
            problems.append(
                f"'tasks.{name}' overrides an unknown task; allowed: {', '.join(sorted(registries.tasks))}"
            )
            continue
        try:  # the merged entry must still be a valid task (a judge block stays complete, L2 keeps K >= 3)
            validate(task_settings(config, registries, name), task_schema, f"'tasks.{name}' merged over config/tasks/")
        except ConfigError as error:
            problems.append(str(error))
            invalid.add(name)
    if task_problems is not None:
        swept = dict.fromkeys(name for grid in grids for name in grid["tasks"] if name in registries.tasks)
        for name in swept:
            if name not in invalid:
                problems += task_problems(task_settings(config, registries, name))
    problems += _narrative_problems(config["report"]["narrative"], registries)
    problems += _text_judge_problems("audit.judge", config["audit"].get("judge"), registries, "set audit.judge: null")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    return canonical(config)


def _narrative_problems(narrative: dict, registries: Registries) -> list[str]:
    """The optional LLM narrative needs a judge that writes text: openai, or local with a registered model."""
    if not narrative.get("enabled"):
        return []
    return _text_judge_problems(
        "report.narrative.judge", narrative.get("judge") or {}, registries, "set report.narrative.enabled: false"
    )


def _text_judge_problems(key: str, judge: dict | None, registries: Registries, off: str) -> list[str]:
    """A judge that writes text (the narrative's, the trace judge's): openai, or local with a registered
    model; None: the feature is off."""
    if judge is None:
        return []
    backend = judge.get("backend")
    if backend not in ("openai", "local"):
        return [
            f"'{key}.backend' is {backend!r}; it needs a judge that writes text: "
            f"give {key} as {{backend: openai, model: ...}} or {{backend: local, model: <models entry>}}, or {off}"
        ]
    if not judge.get("model"):
        return [f"'{key}.model' is missing; name the judge's model"]
    if backend == "local" and judge["model"] not in registries.models:
        return [
            f"'{key}.model' is {judge['model']!r}, which is not in config/models/; "
            f"allowed values: {', '.join(sorted(registries.models))}"
        ]
    return []


def sweep_grids(config: dict) -> list[dict]:
    """The sweep as a list of grids (a single grid is a list of one)."""
    sweep = config["sweep"]
    return [sweep] if isinstance(sweep, dict) else list(sweep)


def grid_mode(grid: dict) -> str:
    """A grid's `mode`: single (one run per task) or multi (its tasks are one multi-task run)."""
    return grid.get("mode") or "single"


# A multi-task run's name for its tasks (its run directory's `tasks` part): the task names sorted and joined by
# MULTI_JOIN, so that a grid's task order never makes two runs of one set of tasks. Task names never hold it.
MULTI_JOIN = "+"
# Where multi-task runs live under results/runs/ (beside one folder per task): no task may have this name.
MULTI_DIR = "multi"


def multi_group(tasks: list[str]) -> str:
    """The name of the multi-task run over `tasks`: e.g. alfworld+alpaca-eval+gsm8k."""
    return MULTI_JOIN.join(sorted(tasks))


def group_tasks(group: str) -> list[str]:
    """The tasks of a multi-task run, from its name (multi_group's inverse)."""
    return group.split(MULTI_JOIN)


def multi_runs(config: dict) -> list[dict]:
    """Every multi-task run of the sweep (grids with mode multi), in grid order, each once: {"tasks": its name
    (multi_group), "task_list": its tasks sorted, "model", "agent", "seed", "time_limit_s": its budget (the grid's
    time_limit_s, else budget.time_limit_s)}."""
    runs: dict[tuple, dict] = {}
    for grid in sweep_grids(config):
        if grid_mode(grid) != "multi":
            continue
        group = multi_group(grid["tasks"])
        budget = grid.get("time_limit_s", config["budget"]["time_limit_s"])
        for model in grid["models"]:
            for agent in grid["agents"]:
                for seed in grid["seeds"]:
                    runs.setdefault(
                        (group, model, agent, seed),
                        dict(tasks=group, task_list=group_tasks(group), model=model, agent=agent, seed=seed, time_limit_s=budget),
                    )
    return list(runs.values())


def multi_run_budget(config: dict, group: str, model: str, agent: str, seed: int) -> float:
    """The time limit of one multi-task run (multi_runs)."""
    for run in multi_runs(config):
        if (run["tasks"], run["model"], run["agent"], int(run["seed"])) == (group, model, agent, int(seed)):
            return run["time_limit_s"]
    raise ConfigError(f"no multi-task run {group}/{model}/{agent}/{seed} in the sweep")


def _multi_grid_problems(config: dict, grids: list[dict]) -> list[str]:
    """A multi grid names at least two tasks; time_limit_s belongs to multi grids; one multi run (tasks, model,
    agent, seed) named by two grids gets one budget."""
    problems = []
    budgets: dict[tuple, float] = {}
    for number, grid in enumerate(grids):
        where = "sweep" if isinstance(config["sweep"], dict) else f"sweep[{number}]"
        if grid_mode(grid) != "multi":
            if "time_limit_s" in grid:
                problems.append(f"'{where}.time_limit_s' is for multi-task grids only: set mode: multi, or use budget.time_limit_s")
            continue
        if len(grid["tasks"]) < 2:
            problems.append(f"'{where}' is a multi-task grid (mode: multi) with one task: name two or more, or drop mode")
            continue
        budget = grid.get("time_limit_s", config["budget"]["time_limit_s"])
        for model in grid["models"]:
            for agent in grid["agents"]:
                for seed in grid["seeds"]:
                    key = (multi_group(grid["tasks"]), model, agent, seed)
                    if budgets.setdefault(key, budget) != budget:
                        problems.append(
                            f"'{where}' gives the multi-task run {'/'.join(map(str, key))} the budget {budget} s, "
                            f"another grid {budgets[key]} s: give it one"
                        )
    return problems


def sweep_runs(config: dict) -> list[dict]:
    """Every single-task (task, model, agent, seed) of the sweep, in grid order, each once (multi grids' runs:
    multi_runs)."""
    runs: dict[tuple, dict] = {}
    for grid in sweep_grids(config):
        if grid_mode(grid) != "single":
            continue
        for task in grid["tasks"]:
            for model in grid["models"]:
                for agent in grid["agents"]:
                    for seed in grid["seeds"]:
                        runs.setdefault((task, model, agent, seed), dict(task=task, model=model, agent=agent, seed=seed))
    return list(runs.values())


def task_settings(config: dict, registries: Registries, task: str) -> dict:
    """The registry entry of a task with the sweep's overrides applied."""
    settings = copy.deepcopy(registries.tasks[task])
    for key, value in config.get("tasks", {}).get(task, {}).items():
        # Blocks (judge, execution) are merged, so a sweep can change one key of them.
        settings[key] = _merged(settings[key], value) if isinstance(value, dict) and isinstance(settings.get(key), dict) else value
    scoring = scoring_settings(settings)
    settings.pop("scoring", None)
    if scoring["feedback"] != "full":  # absent = full: the reference's settings, byte for byte
        settings["scoring"] = scoring
    return canonical(settings)


@functools.lru_cache(maxsize=1)
def _scoring_schema() -> dict:
    """The task schema's `scoring` block (read once: task_settings runs for every job the workflow plans)."""
    return load_schema("task")["properties"]["scoring"]


def scoring_settings(settings: dict) -> dict:
    """What a task's /submit reports on (its `scoring:` block, defaults from the task schema):
    {"feedback": "full"} (the reference: the whole held-out split), or {"feedback": "split",
    "final_share": s}: a salted share s of the held-out items is the final split, evaluated privately
    and never reported to the agent (rlbench.tasks.base.partition_items). A share is kept only in split mode."""
    schema = _scoring_schema()
    block = copy.deepcopy(settings.get("scoring") or {})
    _fill_defaults(block, schema)
    if block["feedback"] == "full":
        return {"feedback": "full"}
    return {"feedback": block["feedback"], "final_share": float(block["final_share"])}


def current_task_settings(config: dict, task: str) -> dict:
    """task_settings from inside a rule script, for settings that must not be rerun triggers."""
    return task_settings(config, Registries.load(), task)
