"""What a run leaves behind: the submission ledger's records, the agent's code at each submission (a shadow
git repository), the resource trace, the workspace's final state, a run reconstructed from its record,
and the provenance every score rests on.

Modules: ledger (the submission ledger's records), repository (the shadow git repository of the agent's
code: CodeRepository, code_revisions), trace (the resource trace: ResourceSampler, summarize_trace),
workspace_state (the workspace's size and final state: workspace_usage), transcript (the LLM gateway's
transcript read back, whatever the agent's wire format), reconstruct (a run reconstructed from its record
alone), provenance (what every score rests on).

Builds on: paths, fileio, tasks.
"""
