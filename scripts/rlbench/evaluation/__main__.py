"""`python -m rlbench.evaluation`: the evaluating process the grader starts.

    python -m rlbench.evaluation REQUEST RESULT ERROR PARENT_PID     one request in a fresh child (child.run_in_child)
    python -m rlbench.evaluation --worker PARENT_PID                 a warm worker (workers.WorkerPool)
"""

import sys

from rlbench.evaluation.child import child_main
from rlbench.evaluation.workers import worker_main

if sys.argv[1:2] == ["--worker"]:
    worker_main(*sys.argv[2:])
else:
    child_main(*sys.argv[1:5])
