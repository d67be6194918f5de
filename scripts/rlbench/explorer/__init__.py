"""One run's story on one page: the run explorer (results/runs/.../reports/run.html).

The page ties together what a run recorded, on one time axis (seconds since the run started): the
agent's turns (its LLM calls from the gateway transcript, or agent.log lines for the reference
agents), every submission (score, status, the code diff against the previous one from
grader/code.git, the checkpoint manifest, the evaluation's metrics), the budget and what cut it,
the resource trace, the summary's iterations and the integrity and mode-audit verdicts.

- `turns`: the agent's turns, read from gateway/transcript.jsonl (+ usage.jsonl) whatever the tool's
  wire format (chat completions, Anthropic messages, Responses, Gemini), or from agent.log with each
  line's time bounded by the resource trace's agent_log_bytes;
- `data`: the page's data (one JSON document, schema below) from a run directory;
- `render`: the standalone HTML page (inline CSS, JavaScript and data; no external URL);
- `build`: write the page, and say whether it is older than what it shows (`rlbench view`).

The page's data (`data.page_data`), a JSON object; times are seconds since the run started (t), or
null when unknown:

    schema      1
    title       "task / model / agent / seed N"
    run         labels, status, exit_code, timed_out, error, stopped_by, start_time, end_time,
                budget_s, duration_s, mode, scaffold, driver, tokens
    cuts        [{t, kind, detail}]: where the budget ends (kind "budget") and what ended the run
                ("end", "timeout", "stopped", "interrupted", "error")
    final       {score, baseline_score, delta, primary_metric, metrics} or null
    summary     {best, delta, baseline, route, failure_type, metrics (the paper's ten),
                 iterations: summary.json's per-iteration records (short fields)} or null
    verdicts    {integrity: integrity.json's verdict and reasons or null, mode_audit: summary.json's or null,
                 members (a multi-task run only): {task: {integrity, mode_audit}}}
    turns       [{i, t, t_exact, kind ("llm" | "log"), ok, error, label (one line), tools [names],
                  model, tokens_in, tokens_out, latency_s,
                  messages [{role, name?, text}] (what the call added to the conversation),
                  response [{role, name?, text}] (the answer: text and tool calls)}]
    tools       every tool name that appears in turns, sorted
    submissions [{id, t, task?, status, reason, error, score, improvement, model_path,
                  code_revision, code_files [paths] or null, diff_against (submission id) or null,
                  diff (unified diff text; "" when unchanged, null without a code revision),
                  checkpoint {fingerprint, method, files [{name, size, sha256}], config} or null,
                  metrics {name: value} or null}]
    resources   {t [...], cpu_percent [...], rss_bytes [...], workspace_bytes [...],
                 gpus {index: {utilization_percent [...], memory_used_mib [...], memory_total_mib}}}
                or null
    missing     the records the run does not have (gateway/transcript.jsonl, grader/code.git, ...)

Builds on: paths, fileio, recording, summaries.
"""
