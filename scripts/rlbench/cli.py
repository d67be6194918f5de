"""The `rlbench` command: run the workflow, see where runs stand, print the leaderboard.

    rlbench run [--config FILE] [--cores N] [-- SNAKEMAKE ARGS...]
    rlbench resume [--config FILE] [--cores N] [-- SNAKEMAKE ARGS...]
    rlbench status [--results DIR]
    rlbench report [--results DIR]
    rlbench regenerate [--config FILE] [--cores N] [--html FILE] [-- SNAKEMAKE ARGS...]
    rlbench reconstruct RUN_DIR
    rlbench view [RUN_DIR] [--serve] [--port N] [--no-open] [--results DIR]

Builds on: paths, config, recording, coding_agents, explorer, snakemake_errors.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from rlbench.config import MULTI_DIR, MULTI_JOIN
from rlbench.paths import REPO_ROOT



def _repo() -> Path:
    if not (REPO_ROOT / "Snakefile").is_file():
        sys.exit(f"rlbench run needs the repository checkout with its Snakefile; none at {REPO_ROOT}")
    return REPO_ROOT


def _snakemake(args: argparse.Namespace, *options: str) -> list[str]:
    """A Snakemake command line on the sweep's config (checked before anything starts)."""
    command = [sys.executable, "-m", "snakemake", *options]
    if args.config:
        from rlbench.snakemake_errors import config_file_problem

        config = Path(args.config).resolve()
        problem = config_file_problem(config)
        if problem is not None:
            sys.exit(problem)
        command += ["--configfile", str(config)]
    return command + args.snakemake


def _call(command: list[str], root: Path) -> int:
    print("+ " + " ".join(command), file=sys.stderr)
    return subprocess.call(command, cwd=root)


def run(args: argparse.Namespace) -> int:
    root = _repo()
    return _call(_snakemake(args, "--profile", "workflow/profiles/local", "--cores", str(args.cores)), root)


def resume(args: argparse.Namespace) -> int:
    """After an interrupted sweep (as `make resume`): release the stale lock, then carry on with the
    same config. Only when no other Snakemake process works in this directory."""
    root = _repo()
    unlock = _snakemake(args, "--unlock")
    return _call(unlock, root) or run(args)


# The analysis stage: what `rlbench regenerate` reruns (per-run summaries, tables, figures).
ANALYSIS_RULES = (
    "summarize_run", "summarize_member", "summarize_multi", "run_page", "run_page_multi", "aggregate", "report_figures",
)  # fmt: skip
# Every rerun trigger but `code`: Snakemake reruns a `script:` rule whose script is newer than its outputs, so
# after an update of the harness (a checkout touches the rule scripts) every recorded run would look unfinished.
# Regenerating reads the recorded runs as they are; the analysis rules rerun anyway (--forcerun).
REGENERATE_TRIGGERS = ("mtime", "params", "input", "software-env")
REPORT_HTML = "results/report/report.html"


def planned_rules(output: str) -> dict[str, int]:
    """Rule -> job count from the "Job stats" table Snakemake prints for a (dry) run."""
    table = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\ntotal", output, re.S)
    if table is None:
        return {}
    return {name: int(count) for name, count in (line.split() for line in table.group(1).splitlines())}


def regenerate(args: argparse.Namespace) -> int:
    """Every per-run summary, table and figure again from the recorded runs, then the HTML report
    (`make report`). Refuses, naming the jobs, when that would run anything but the analysis stage
    (an unfinished sweep: finish it with `rlbench run` first): no agent and no evaluation is rerun, also
    after the harness was updated since the runs were recorded (REGENERATE_TRIGGERS)."""
    root = _repo()
    base = _snakemake(
        args, "--profile", "workflow/profiles/local", "--cores", str(args.cores),
        "--rerun-triggers", *REGENERATE_TRIGGERS, "--forcerun", *ANALYSIS_RULES,
    )
    plan = subprocess.run([*base, "-n"], cwd=root, capture_output=True, text=True)
    if plan.returncode != 0:
        sys.stderr.write(plan.stdout[-3000:] + plan.stderr[-3000:])
        print("error: the dry run failed (above); nothing was regenerated", file=sys.stderr)
        return plan.returncode
    jobs = planned_rules(plan.stdout + plan.stderr)
    other = {rule: n for rule, n in jobs.items() if rule not in (*ANALYSIS_RULES, "all")}
    if other:
        listed = ", ".join(f"{rule} ({n})" for rule, n in sorted(other.items()))
        print(
            f"error: the sweep is not finished: regenerating the report would also run {listed}. "
            "Finish the sweep first (`make run`, or `rlbench run` with the same config), then regenerate.",
            file=sys.stderr,
        )
        return 2
    print(f"regenerating: {', '.join(f'{r} ({n})' for r, n in jobs.items() if r != 'all')}", file=sys.stderr)
    code = _call(base, root)
    if code:
        return code
    html = Path(args.html)
    return _call(_snakemake(args, "--report", str(html if html.is_absolute() else Path.cwd() / html)), root)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_dirs(results: Path) -> list[Path]:
    """Every run's directory under results/runs: the single-task runs' and the multi-task runs' (not
    their tasks' views): the single-task runs sorted, then the multi-task runs sorted."""
    runs = results / "runs"
    found = sorted(d for d in runs.glob("*/*/*/*") if d.relative_to(runs).parts[0] != MULTI_DIR)
    found += sorted(runs.glob(f"{MULTI_DIR}/*/*/*/*"))
    return [d for d in found if d.is_dir()]


def run_rows(results: Path) -> list[dict]:
    """One row per run directory under results/runs (a multi-task run: one per task, `multi` naming the run's
    tasks, results/runs/multi/TASKS/MODEL/AGENT/SEED/tasks/TASK): where it stands and what it scored."""
    rows = []
    runs = results / "runs"
    for run_dir in run_dirs(results):
        parts = run_dir.relative_to(runs).parts
        group = parts[1] if parts[0] == MULTI_DIR else None
        record = _read(run_dir / "run.json")
        if record is None:
            state = "started" if (run_dir / "attempt.json").exists() else "prepared"
        else:
            state = record.get("status", "?")
        if group is None:
            views = [(parts[0], run_dir)]
        else:
            views = [(task, run_dir / "tasks" / task) for task in group.split(MULTI_JOIN)]
        for task, view in views:
            final = _read(view / "final.json")
            rows.append(
                {
                    "task": task,
                    "model": parts[-3],
                    "agent": parts[-2],
                    "seed": parts[-1],
                    "status": state,
                    "submissions": "" if record is None else record.get("submissions", ""),
                    "baseline": "" if final is None else final.get("baseline_score", ""),
                    "best": "" if final is None else final.get("score", ""),
                    "delta": "" if final is None else final.get("delta", ""),
                    "summarized": "yes" if (view / "summary.json").exists() else "no",
                    "multi": group or "",
                }
            )
    return rows


def _print_table(rows: list[dict]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns))


def status(args: argparse.Namespace) -> int:
    rows = run_rows(Path(args.results))
    if not rows:
        print(f"no runs under {args.results}/runs yet: start them with `rlbench run`")
        return 1
    _print_table(rows)
    return 0


def report(args: argparse.Namespace) -> int:
    path = Path(args.results) / "report" / "leaderboard.csv"
    if not path.is_file():
        print(f"{path} does not exist yet: `rlbench run` writes it when the sweep finishes")
        return 1
    with open(path, newline="") as handle:
        _print_table(list(csv.DictReader(handle)))
    return 0


def setup_agents_command(args: argparse.Namespace) -> int:
    from rlbench.config import ConfigError, Registries
    from rlbench.coding_agents.setup import setup_agents
    from rlbench.coding_agents.tools import SetupError

    try:
        failures = setup_agents(Registries.load().agents, args.agents, gateway=not args.no_gateway)
    except (ConfigError, SetupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


def reconstruct(args: argparse.Namespace) -> int:
    """A run as its record tells it (rlbench.recording.reconstruct.reconstruct), as JSON on stdout."""
    from rlbench.recording.reconstruct import reconstruct as reconstruct_run

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"no run directory at {run_dir}", file=sys.stderr)
        return 1
    json.dump(reconstruct_run(run_dir), sys.stdout, indent=2, default=str)
    print()
    return 0


def _list_pages(results: Path) -> int:
    from rlbench.explorer.build import is_run_dir, is_stale, page_path

    dirs = [d for d in run_dirs(results) if is_run_dir(d)]
    if not dirs:
        print(f"no recorded runs under {results}/runs yet: start them with `rlbench run`")
        return 1
    rows = []
    for run_dir in dirs:
        record = _read(run_dir / "run.json") or {}
        page = page_path(run_dir)
        built = "missing" if not page.is_file() else ("stale" if is_stale(run_dir) else "yes")
        rows.append({"run": str(run_dir), "status": record.get("status", "?"), "page": built})
    _print_table(rows)
    print("\nopen one: rlbench view RUN_DIR (builds its page first when missing or stale)")
    return 0


def _can_open_browser() -> bool:
    """A graphical browser can be started here: a display (or macOS) and a browser webbrowser knows."""
    import webbrowser

    if sys.platform != "darwin" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def serve_page(page: Path, port: int = 0) -> None:
    """Serve the page's directory on 127.0.0.1 (port 0: a free one), print the page's URL, and serve until
    interrupted (Ctrl-C)."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    handler.log_message = lambda *a, **k: None  # the URL is the only line the user needs
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving the run's page at http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def view(args: argparse.Namespace) -> int:
    """`rlbench view RUN_DIR`: build the run's explorer page when it is missing or older than the run's records,
    then open it in a browser, or serve it on localhost and print the URL where no browser can open;
    without RUN_DIR: list the runs and their pages."""
    from rlbench.explorer.build import build_page, is_run_dir, is_stale, page_path

    if args.run_dir is None:
        return _list_pages(Path(args.results))
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir() or not is_run_dir(run_dir):
        print(
            f"error: {run_dir} is not a run's directory (it needs run.json or grader/ledger.jsonl); "
            "`rlbench view` lists the recorded runs",
            file=sys.stderr,
        )
        return 2
    page = page_path(run_dir)
    if is_stale(run_dir):
        build_page(run_dir)
        print(f"built {page}")
    else:
        print(f"up to date: {page}")
    if args.no_open:
        return 0
    if not args.serve and _can_open_browser():
        import webbrowser

        if webbrowser.open(page.resolve().as_uri()):
            print(f"opened {page.resolve().as_uri()}")
            return 0
    serve_page(page, args.port)
    return 0


def cores(text: str) -> int:
    """--cores: a whole number of at least 1 (Snakemake given 0 waits forever for a core to run a job on)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of cores") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} cores: give 1 or more (Snakemake would wait forever with none)")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlbench", description="Agent² RL-Bench: run the benchmark workflow.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("run", "run (or continue) a sweep with Snakemake"),
        ("resume", "after an interruption: release Snakemake's stale lock, then continue the sweep"),
    ):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("--config", help="the sweep's config file (default: config/config.yaml)")
        sub.add_argument("--cores", type=cores, default=os.cpu_count() or 1,
                         help="CPU cores Snakemake may use at once (default: all of this machine's)")
        sub.add_argument("snakemake", nargs=argparse.REMAINDER, help="extra Snakemake arguments, after --")
    for name, helptext in (("status", "where every run stands"), ("report", "print the leaderboard")):
        sub = commands.add_parser(name, help=helptext)
        sub.add_argument("--results", default="results", help="the results directory (default: results)")
    sub = commands.add_parser("setup-agents", help="install the pinned coding-agent tools and the LLM gateway (.tools/)")
    sub.add_argument("agents", nargs="*", help="agent names from config/agents/ (default: every cli agent)")
    sub.add_argument("--no-gateway", action="store_true", help="do not install the LLM gateway")
    sub = commands.add_parser(
        "regenerate",
        help="every summary, table and figure again from the recorded runs, and the HTML report (no agent, no evaluation)",
    )
    sub.add_argument("--config", help="the sweep's config file (default: config/config.yaml)")
    sub.add_argument("--cores", type=cores, default=2, help="CPU cores Snakemake may use at once (default: 2)")
    sub.add_argument("--html", default=REPORT_HTML, help=f"where the HTML report goes (default: {REPORT_HTML})")
    sub.add_argument("snakemake", nargs=argparse.REMAINDER, help="extra Snakemake arguments, after --")
    sub = commands.add_parser(
        "reconstruct", help="a run from its record: prompt, transcript, code at each submission, scores"
    )
    sub.add_argument("run_dir", help="a run directory, results/runs/TASK/MODEL/AGENT/SEED")
    sub = commands.add_parser(
        "view", help="a run's page (turns, submissions, code diffs, resources): build it if needed and open it"
    )
    sub.add_argument("run_dir", nargs="?", help="a run directory (without it: list the runs and their pages)")
    sub.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 and print its URL")
    sub.add_argument("--port", type=int, default=0, help="the port to serve on (default: a free one)")
    sub.add_argument("--no-open", action="store_true", help="only build the page (when needed) and print its path")
    sub.add_argument("--results", default="results", help="the results directory listed (default: results)")
    args = parser.parse_args(argv)
    if args.command in ("run", "resume", "regenerate") and args.snakemake[:1] == ["--"]:
        args.snakemake = args.snakemake[1:]
    commands_by_name = {"run": run, "resume": resume, "status": status, "report": report}
    commands_by_name["setup-agents"] = setup_agents_command
    commands_by_name["reconstruct"] = reconstruct
    commands_by_name["regenerate"] = regenerate
    commands_by_name["view"] = view
    return commands_by_name[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
