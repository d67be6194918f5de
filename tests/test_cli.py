"""The `rlbench` command: status and report read recorded runs; run drives Snakemake."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlbench import cli


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_status_shows_each_run_as_it_stands(tmp_path, capsys):
    runs = tmp_path / "runs" / "gsm8k" / "tiny"
    write(runs / "copy" / "0" / "run.json", {"status": "completed", "submissions": 1})
    write(runs / "copy" / "0" / "final.json", {"baseline_score": 3.0, "score": 3.0, "delta": 0.0})
    (runs / "copy" / "0" / "summary.json").write_text("{}")
    write(runs / "sft" / "0" / "attempt.json", {"attempt": 1})
    # a multi-task run: one row per task, from its tasks/<task>/ view
    multi = tmp_path / "runs" / "multi" / "gsm8k+humaneval" / "tiny" / "copy" / "0"
    write(multi / "run.json", {"status": "completed", "submissions": 1})
    write(multi / "tasks" / "humaneval" / "final.json", {"baseline_score": 0.0, "score": 0.0, "delta": 0.0})
    assert cli.main(["status", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["task", "model", "agent", "seed", "status", "submissions", "baseline", "best",
                                "delta", "summarized", "multi"]
    assert lines[1].split() == ["gsm8k", "tiny", "copy", "0", "completed", "1", "3.0", "3.0", "0.0", "yes"]
    assert lines[2].split() == ["gsm8k", "tiny", "sft", "0", "started", "no"]
    assert lines[3].split() == ["gsm8k", "tiny", "copy", "0", "completed", "1", "no", "gsm8k+humaneval"]
    assert lines[4].split() == ["humaneval", "tiny", "copy", "0", "completed", "1", "0.0", "0.0", "0.0", "no",
                                "gsm8k+humaneval"]


def test_report_prints_the_leaderboard_or_says_how_to_make_it(tmp_path, capsys):
    assert cli.main(["report", "--results", str(tmp_path)]) == 1
    assert "rlbench run" in capsys.readouterr().out
    board = tmp_path / "report" / "leaderboard.csv"
    board.parent.mkdir(parents=True)
    board.write_text("task,agent,delta\ngsm8k,copy,0.0\n")
    assert cli.main(["report", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["gsm8k", "copy", "0.0"]


def test_run_refuses_a_missing_config_file(tmp_path):
    with pytest.raises(SystemExit, match="config file '.*nope.yaml' not found"):
        cli.main(["run", "--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(SystemExit, match="is a directory; give a YAML file"):
        cli.main(["run", "--config", str(tmp_path)])


UNREADABLE_CONFIGS = {
    "not YAML": (b"sweep:\n\t- tasks: [gsm8k]\n", "is not valid YAML at line 2, column 1: found character '\\t'"),
    "a list": (b"- gsm8k\n- copy\n", "holds a list, not a mapping of top-level keys"),
    "empty": (b"", "holds nothing, not a mapping"),
    "not UTF-8": (b"sweep: \xff\n", "is not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_CONFIGS))
def test_run_says_which_file_where_and_why_before_snakemake_starts(case, tmp_path, capfd):
    """`rlbench run` starts Snakemake as `python -m snakemake`, where the venv's config-error hook does
    not load: the CLI reads the file first, and a file Snakemake could not read ends there, named."""
    text, says = UNREADABLE_CONFIGS[case]
    config = tmp_path / "sweep.yaml"
    config.write_bytes(text)
    with pytest.raises(SystemExit) as raised:
        cli.main(["run", "--config", str(config)])
    assert str(config) in str(raised.value) and says in str(raised.value)
    assert "+ " not in capfd.readouterr().err  # no Snakemake command was started


def test_bare_snakemake_says_the_same_for_a_config_it_cannot_read(tmp_path):
    """`snakemake --configfile` (make run CONFIG=...): the venv's hook (workflow/snakemake_errors.pth)
    turns Snakemake's own message, which names neither file nor line, into the CLI's."""
    snakemake = Path(sys.executable).with_name("snakemake")
    if not snakemake.exists():
        pytest.skip("no snakemake command beside this Python")
    config = tmp_path / "sweep.yaml"
    config.write_bytes(UNREADABLE_CONFIGS["not YAML"][0])
    proc = subprocess.run([str(snakemake), "-n", "--configfile", str(config)], cwd=cli.REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert f"config file '{config}' is not valid YAML at line 2, column 1" in said, said[-2000:]


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("rlbench")
    assert script.exists() or shutil.which("rlbench"), "pip install -e . installs the rlbench command"
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "run" in out.stdout and "status" in out.stdout and "report" in out.stdout


def test_run_drives_snakemake_with_the_given_config(tmp_path, capfd):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        "sweep: {tasks: [gsm8k], models: [tiny], agents: [copy], seeds: [0, 7]}\nbudget: {time_limit_s: 30}\n"
    )
    assert cli.main(["run", "--config", str(config), "--cores", "1", "--", "-n", "--directory", str(tmp_path)]) == 0
    out = capfd.readouterr()
    assert "runs/gsm8k/tiny/copy/7/run.json" in out.out + out.err


def test_resume_unlocks_then_continues_the_given_sweep(tmp_path, capfd):
    config = tmp_path / "sweep.yaml"
    config.write_text("sweep: {tasks: [gsm8k], models: [tiny], agents: [copy], seeds: [7]}\n"
                      "budget: {time_limit_s: 30}\n")
    assert cli.main(["resume", "--config", str(config), "--cores", "1", "--", "-n", "--directory", str(tmp_path)]) == 0
    out = capfd.readouterr()
    commands = [line for line in out.err.splitlines() if line.startswith("+ ")]
    assert "--unlock" in commands[0] and all(f"--configfile {config}" in c for c in commands)
    assert "runs/gsm8k/tiny/copy/7/run.json" in out.out + out.err
    with pytest.raises(SystemExit, match="config file '.*nope.yaml' not found"):
        cli.main(["resume", "--config", str(tmp_path / "nope.yaml")])


MAKE = shutil.which("make")


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["run", "resume", "dry-run", "rerun-agent RUN=results/runs/gsm8k/tiny/sft/0"])
def test_make_targets_pass_the_sweep_config(target, tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text("sweep: {tasks: [gsm8k]}\n")
    proc = subprocess.run([MAKE, "-n", *target.split(), f"CONFIG={config}"], cwd=cli.REPO_ROOT, capture_output=True,
                          text=True)
    snakemake_lines = [line for line in proc.stdout.splitlines() if "snakemake" in line and "pip" not in line]
    assert proc.returncode == 0 and snakemake_lines, proc.stderr
    assert all(f"--configfile {config}" in line for line in snakemake_lines), snakemake_lines
    plain = subprocess.run([MAKE, "-n", *target.split()], cwd=cli.REPO_ROOT, capture_output=True, text=True)
    assert plain.returncode == 0 and "--configfile" not in plain.stdout


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_make_refuses_a_missing_config_before_snakemake_starts(tmp_path):
    proc = subprocess.run([MAKE, "-n", "resume", f"CONFIG={tmp_path / 'nope.yaml'}"], cwd=cli.REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "nope.yaml is not a readable file" in proc.stderr
    assert "snakemake" not in proc.stdout


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_run_refuses_cores_snakemake_would_wait_on_forever(value, capsys):
    """Snakemake given --cores 0 never schedules a job and never ends: refused before it starts."""
    for command in ("run", "resume", "regenerate"):
        with pytest.raises(SystemExit) as raised:
            cli.main([command, "--cores", value, "--", "-n"])
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert "--cores" in err and ("give 1 or more" in err or "not a whole number of cores" in err), err


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
@pytest.mark.parametrize("value", ["0", "x"])
def test_make_refuses_cores_below_one(value):
    proc = subprocess.run([MAKE, "-n", "run", f"CORES={value}"], cwd=cli.REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode != 0 and f"CORES={value}: give a whole number of cores, 1 or more" in proc.stderr
    assert "snakemake" not in proc.stdout
