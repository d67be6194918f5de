"""Control agent: submit the untouched base model. It must score exactly the baseline (Δ = 0).

Reads MODEL_PATH, OUTPUT_DIR, WORKSPACE and GRADING_SERVER_URL. Exit 0 when the submission got a
score, 1 otherwise.
"""

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_env import MODEL_PATH, OUTPUT_DIR, log, submit  # noqa: E402

target = OUTPUT_DIR / "base"
for source in sorted(MODEL_PATH.rglob("*")):
    if source.is_file():  # follows symlinks; plain copies stay writable
        (target / source.relative_to(MODEL_PATH)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target / source.relative_to(MODEL_PATH))
log(f"copied {MODEL_PATH} -> {target}")

result = submit(target)
sys.exit(0 if result is not None else 1)
