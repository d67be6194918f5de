"""Across runs: the paper's tables, the figures, the HTML report page, and the headless browser that checks it.

- `catalogue`: the one list of the report's tables and figures (name, kind, title, caption, builder) in
  report order; builds every table (`build_tables`);
- `stats`: the definitions the tables and figures share (configuration, cell, Δ, noise band, signed Δ) and
  the paper's statistics (Δ at a budget cut, pass@k, bootstrap CI);
- `tables`: one builder per table of the paper;
- `tablefiles`: a table (`Table`) and its files, <name>.csv and <name>.md;
- `figures`: the figures, each as PNG and SVG;
- `html`: the standalone page results/report/index.html;
- `report`: leaderboard.csv, one row per run;
- `browser`: headless Chromium, to check the HTML report as a reader sees it.

The settings of the analysis are config `report:`, validated and with the schema's defaults filled in
(rlbench.config.report_settings).

Builds on: paths, fileio, config, summaries.
"""
