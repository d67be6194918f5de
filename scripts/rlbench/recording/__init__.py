"""What a run leaves behind: the submission ledger's records, the agent's code at each submission (a shadow
git repository), the resource trace, the workspace's final state, a run reconstructed from its record,
and the provenance every score rests on.

Builds on: paths, fileio, tasks.
"""
