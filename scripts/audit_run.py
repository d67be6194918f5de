"""Rule audit_run: what a run's score can be trusted for (rlbench.integrity): the contamination scan of
everything the agent wrote or its driver said against the held-out items (and of the training split
itself), the best submission's weight lineage against the base model, and the optional trace judge
(config audit.judge); their verdict goes to integrity.json."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.integrity.contamination import scan_run
from rlbench.integrity.lineage import compare_models
from rlbench.integrity.verdict import run_integrity

run_dir = Path(snakemake.input.run).parent
audit = snakemake.params.audit
artifacts = read_json(Path(snakemake.input.artifacts))
problems = []
contamination = scan_run(
    run_dir,
    list(read_jsonl(Path(snakemake.input.eval))),
    list(read_jsonl(Path(snakemake.input.train))),
    threshold=float(audit["contamination_threshold"]),
)
lineage = None
if artifacts.get("best_model"):
    lineage = compare_models(Path(snakemake.input.base_model), Path(artifacts["best_model"]))
judge = None
if audit.get("judge"):
    from rlbench.integrity.trace_judge import judge_trace

    judge_model = snakemake.input.get("judge_model")
    judge = judge_trace(
        run_dir, audit["judge"], Path(snakemake.params.judgments), model_dir=Path(judge_model) if judge_model else None
    )
    problems += [f"trace judge: {problem}" for problem in judge.get("problems") or []]
integrity = run_integrity(contamination, lineage, judge, problems=problems)
print(f"integrity: {integrity['label']}", file=sys.stderr)
write_json(Path(snakemake.output.integrity), integrity)
