"""Clear errors for a config file Snakemake itself cannot read, on the bare `snakemake --configfile` path.

Snakemake reads --configfile before the workflow's own checks run: a missing file ended in a 19-line
traceback, a YAML syntax error in a message that named neither the file nor the line. The project's
virtual environment loads this module into the `snakemake` command only (workflow/snakemake_errors.pth,
installed by `make setup`), and it wraps Snakemake's config loader to say which file, where, and what to do.
`rlbench run` (which starts Snakemake as `python -m snakemake`, where that hook does not load) asks
config_file_problem itself before it starts Snakemake.

Builds on: nothing in the library.
"""

from __future__ import annotations

import json
import os


def config_file_problem(path) -> str | None:
    """What keeps `path` from being a sweep config Snakemake can read (missing, a directory, not
    YAML, not a mapping), said with the file, the line and what to do; None when it reads."""
    import yaml

    shown = repr(str(path))
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        try:  # JSON first, as Snakemake reads it (JSON may indent with tabs, which YAML refuses)
            data = json.loads(text)
        except ValueError:
            data = yaml.safe_load(text)
    except FileNotFoundError:
        return (
            f"config file {shown} not found (relative paths start at {os.getcwd()}); give an existing "
            "file, e.g. config/config.yaml, or copy it and edit the copy"
        )
    except IsADirectoryError:
        return f"config file {shown} is a directory; give a YAML file"
    except UnicodeDecodeError as error:
        return f"config file {shown} is not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8"
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = error.problem or error.context or "invalid YAML"
        return (
            f"config file {shown} is not valid YAML{where}: {problem}; fix that line (indent with "
            "spaces, not tabs; quote values that hold ': ' or start with a special character)"
        )
    except (OSError, yaml.YAMLError) as error:
        return f"config file {shown} cannot be read: {error}"
    if not isinstance(data, dict):
        held = "nothing" if data is None else f"a {type(data).__name__}"
        return (
            f"config file {shown} holds {held}, not a mapping of top-level keys (sweep:, tasks:, budget: ...); "
            "see config/config.yaml for the shape"
        )
    return None


def _friendlier(load):
    from snakemake.exceptions import WorkflowError

    def load_configfile(path):
        try:
            return load(path)
        except (OSError, UnicodeDecodeError, WorkflowError) as error:
            problem = config_file_problem(path)
            if problem is not None:
                raise WorkflowError(problem) from None
            raise error

    return load_configfile


def install() -> None:
    """Wrap snakemake.common.configfile.load_configfile (before Snakemake's command line imports it)."""
    try:
        from snakemake.common import configfile
    except ImportError:
        return
    if not getattr(configfile.load_configfile, "rlbench_wrapped", False):
        wrapped = _friendlier(configfile.load_configfile)
        wrapped.rlbench_wrapped = True
        configfile.load_configfile = wrapped
