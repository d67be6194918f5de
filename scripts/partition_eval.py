"""Rule partition_eval: a held-out split's feedback and final parts (config scoring.feedback: split).

partition.json lies beside the split's directory, in the results tree the agent never sees: it names the
items of each part (what the grader, the baseline and the final evaluation restrict their evaluations to),
their counts, the share and the salt's sha256 (never the salt)."""

import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.fileio.jsonio import read_jsonl, write_json
from rlbench.tasks.base import FEEDBACK, FINAL, partition_digest, partition_items, read_salt, row_id, salt_fingerprint

scoring = snakemake.params.scoring
salt = read_salt(Path(snakemake.input.salt))
ids = [row_id(row) for row in read_jsonl(Path(snakemake.input.eval))]
parts = partition_items(ids, salt, snakemake.wildcards.task, scoring["final_share"])
record = {
    "feedback_mode": scoring["feedback"],
    "final_share": scoring["final_share"],
    "salt_sha256": salt_fingerprint(salt),
    "n": len(ids),
    FEEDBACK: {"n": len(parts[FEEDBACK]), "items": parts[FEEDBACK]},
    FINAL: {"n": len(parts[FINAL]), "items": parts[FINAL]},
    "digest": partition_digest(parts),
}
write_json(Path(snakemake.output.partition), record)
print(f"partitioned {len(ids)} held-out items: {record[FEEDBACK]['n']} feedback, {record[FINAL]['n']} final", file=sys.stderr)
