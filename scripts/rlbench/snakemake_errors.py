"""Clear errors for a config file Snakemake itself cannot read, on the bare `snakemake --configfile` path.

Snakemake reads --configfile before the workflow's own checks run: a missing file ended in a 19-line
traceback, a YAML syntax error in a message that named neither the file nor the line. The project's
virtual environment loads this module into the `snakemake` command only (workflow/snakemake_errors.pth,
installed by `make setup`), and it wraps Snakemake's config loader to say which file, where, and what to do.

Builds on: nothing in the library.
"""

from __future__ import annotations

import os


def _friendlier(load):
    from snakemake.exceptions import WorkflowError

    def load_configfile(path):
        try:
            return load(path)
        except FileNotFoundError:
            raise WorkflowError(
                f"config file {str(path)!r} not found (relative paths start at {os.getcwd()}); give an existing "
                "file to --configfile, e.g. config/config.yaml, or copy it and edit the copy"
            ) from None
        except IsADirectoryError:
            raise WorkflowError(f"config file {str(path)!r} is a directory; give a YAML file to --configfile") from None
        except WorkflowError as error:
            import yaml

            try:
                with open(path, encoding="utf-8") as handle:
                    yaml.safe_load(handle)
            except yaml.MarkedYAMLError as yaml_error:
                mark = yaml_error.problem_mark or yaml_error.context_mark
                where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
                problem = yaml_error.problem or yaml_error.context or "invalid YAML"
                raise WorkflowError(
                    f"config file {str(path)!r} is not valid YAML{where}: {problem}; fix that line (indent with "
                    "spaces, not tabs; quote values that hold ': ' or start with a special character)"
                ) from None
            except (OSError, yaml.YAMLError, TypeError):
                pass
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
