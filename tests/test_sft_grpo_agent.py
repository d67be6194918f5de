"""The sft-grpo reference agent (Level 3, ALFWorld): SFT warm-up on expert trajectories, then GRPO
with online rollouts in live games, on the tiny model, against a fake grading server.

Real games come from the offline generator (rlbench.tasks.alfworld.generate); the workspace is
built by hand the way the ALFWorld task lays it out (task.py, data/train.jsonl, data/games/...;
no react_prompts.json, as the reference: the agent writes its few-shot examples itself)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
AGENTS = REPO / "scripts" / "agents"
ALFWORLD = REPO / "scripts" / "rlbench" / "tasks" / "alfworld"
COUNTS = {"pick_and_place_simple": 1, "look_at_obj_in_light": 1}


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> Path:
    generate = pytest.importorskip("rlbench.tasks.alfworld.generate")
    out = tmp_path_factory.mktemp("alfworld") / "games"
    generate.generate_games(out, split="train", world_seed=0, game_seed=0, counts=COUNTS, workers=1)
    return out


def build_workspace(root: Path, games: Path) -> Path:
    """task.py, data/train.jsonl and data/games/ as the ALFWorld task writes them."""
    ws = root / "workspace"
    for name in ("code", "data", "output"):
        (ws / name).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ALFWORLD / "public.py", ws / "task.py")
    manifest = json.loads((games / "manifest.json").read_text())
    rows = []
    for record in manifest["games"]:
        relative = record.get("path") or record.get("game")
        expert = record.get("expert") or record
        trajectory = expert.get("trajectory") or expert.get("expert")
        target = ws / "data" / "games" / Path(relative).parent
        shutil.copytree(games / Path(relative).parent, target)
        rows.append({
            "id": f"train-{len(rows)}",
            "task_type": record["task_type"],
            "game": f"games/{relative}",
            "goal": record["goal"],
            "initial_observation": expert["initial_observation"],
            "expert": trajectory,
            "expert_steps": len(trajectory),
        })
    (ws / "data" / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return ws


class FakeGrader:
    """/time (what is left of budget_s) and /submit (a score for any saved model folder)."""

    def __init__(self, workspace: Path, budget_s: float):
        self.workspace, self.budget_s, self.started = workspace, budget_s, time.time()
        self.submissions: list[str] = []
        grader = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._send(200, {"remaining": grader.budget_s - (time.time() - grader.started)})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                model = grader.workspace / body["model_path"]
                if not (model / "config.json").is_file() or not list(model.glob("*.safetensors")):
                    self._send(422, {"status": "failed", "score": 0.0, "error": "no model"})
                    return
                grader.submissions.append(body["model_path"])
                self._send(200, {"status": "scored", "score": 0.0})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/secret"

    def stop(self):
        self.server.shutdown()


def agent_env(ws: Path, model: Path, url: str, **knobs) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SFT_", "GRPO_"))}
    env.update(
        WORKSPACE=str(ws), MODEL_PATH=str(model), DATA_PATH=str(ws / "data"), OUTPUT_DIR=str(ws / "output"),
        GRADING_SERVER_URL=url, CUDA_VISIBLE_DEVICES="", ALFWORLD_DATA=str(ws.parent / "alfworld-data"),
    )
    env.update({k: str(v) for k, v in knobs.items()})
    return env


@pytest.fixture
def agent(tmp_path, tiny_model, games, monkeypatch):
    """The agent module, imported inside a workspace (agent_env reads the environment at import)."""
    ws = build_workspace(tmp_path, games)
    for key, value in agent_env(ws, tiny_model, "http://127.0.0.1:9/none").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "path", [str(AGENTS), *sys.path])
    for name in ("agent_env", "sft_grpo_agent"):
        sys.modules.pop(name, None)
    module = importlib.import_module("sft_grpo_agent")
    yield module, ws
    for name in ("agent_env", "sft_grpo_agent"):
        sys.modules.pop(name, None)


def test_expert_examples_follow_the_protocol(agent, tiny_model):
    from transformers import AutoTokenizer

    module, ws = agent
    task = module.load_task()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    encoder = module.Encoder(tokenizer)
    rows = module.load_rows()
    row = rows[0]
    # The grader's examples are not in the workspace: the agent writes its own from the experts.
    module.FEW_SHOT.clear()
    module.FEW_SHOT.update(module.few_shot_examples(task, rows))
    assert module.FEW_SHOT["react_put_0"] == task.expert_example(row)
    example, kept, total = module.expert_example(task, encoder, row, 100_000)
    assert kept == total == row["expert_steps"]
    # The sequence is the grader's prompt text after the last expert action, token for token.
    text = task.episode_start(row["task_type"], row["initial_observation"], examples=module.FEW_SHOT)
    for i, step in enumerate(row["expert"]):
        if i:
            previous = row["expert"][i - 1]
            text += task.history_entry(previous["action"], task.step_observation(previous["action"], previous["observation"]))
        context = encoder.prompt(text)
        assert example["input_ids"][: len(context)] == context  # the context of step i is the grader's prompt
        action = encoder.action(step["action"])
        assert example["input_ids"][len(context) : len(context) + len(action)] == action
        assert example["labels"][len(context) : len(context) + len(action)] == action
    # Labels only on the actions: " {action}\n" per step, nothing else.
    trained = tokenizer.decode([t for t in example["labels"] if t != -100])
    assert trained == "".join(f" {step['action']}\n" for step in row["expert"])
    # Too long: the steps that fit are kept, the example ends on an action.
    prompt_len = len(encoder.prompt(task.episode_start(row["task_type"], row["initial_observation"], examples=module.FEW_SHOT)))
    short, kept, _ = module.expert_example(task, encoder, row, prompt_len + 30)
    assert 0 < kept < total and len(short["input_ids"]) <= prompt_len + 30 and short["labels"][-1] != -100
    assert module.expert_example(task, encoder, row, prompt_len + 1)[0] is None


def test_group_advantages_and_reward(agent):
    module, ws = agent
    task = module.load_task()
    adv = module.group_advantages([1.0, 0.0, 0.0, 0.0, 0.5, 0.5], 2)
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] > 0.7  # (1 - 0.5) / (std 0.707 + 1e-4)
    assert adv[2:] == [0.0, 0.0, 0.0, 0.0]  # a group with one reward teaches nothing
    assert module.episode_reward(task, True, 0, 0, 0.1) == 1.0
    assert module.episode_reward(task, False, 3, 4, 0.1) == pytest.approx(0.075)
    assert module.episode_reward(task, False, 3, 4, 0.0) == 0.0


def test_rollouts_play_live_games_in_the_graders_format(agent, tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module, ws = agent
    task = module.load_task()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    rows = module.load_rows()
    pool = module.EnvPool(task, 0, 3)
    stats: dict = {}
    try:
        records = module.play(
            model, tokenizer, task, pool, [(i, rows[i % len(rows)]) for i in range(2)], max_steps=3,
            max_new_tokens=6, temperature=1.0, max_length=4096, newline_ids=module.newline_token_ids(tokenizer),
            check_context=2, stats=stats,
        )
    finally:
        pool.close()
    assert stats.get("context_mismatches", 0) == 0  # every step's context was the grader's prompt
    for record in records:
        assert record["steps"] == 3 and record["end"] in ("done", "max_steps") and not record["won"]
        assert len(record["completion_ids"]) == len(record["env_mask"]) and record["env_mask"][-1] == 1
        assert 0 <= record["valid"] <= record["counted"] <= 3


def test_rollouts_in_worker_processes_win_with_the_expert(agent, tiny_model):
    """The environment pool in worker processes: replaying the expert's actions wins."""
    module, ws = agent
    task = module.load_task()
    rows = module.load_rows()
    pool = module.EnvPool(task, 2, 50)
    try:
        pool.reset({i: module.game_path(row) for i, row in enumerate(rows)})
        results = {}
        for t in range(max(len(row["expert"]) for row in rows)):
            actions = {i: row["expert"][t]["action"] for i, row in enumerate(rows) if t < len(row["expert"])}
            for i, (observation, won, done, info) in pool.step(actions).items():
                assert observation == rows[i]["expert"][t]["observation"]
                results[i] = won
        pool.release(list(range(len(rows))))
    finally:
        pool.close()
    assert all(results.values()) and len(results) == len(rows)


def test_grpo_step_trains_the_action_tokens_with_group_advantages(agent, tiny_model, monkeypatch):
    """TRL's GRPOTrainer with the agent's rollout_func: group-relative advantages from the episode
    rewards, the loss masked to the action tokens, and an optimizer step that moves the weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module, ws = agent
    task = module.load_task()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    rows = module.load_rows()[:1]
    for name, value in {"GRPO_ROUNDS": 1, "GRPO_STEPS_PER_ROUND": 1, "GRPO_GAMES_PER_STEP": 1,
                        "GRPO_NUM_GENERATIONS": 2, "GRPO_MAX_EPISODE_STEPS": 2, "GRPO_MAX_NEW_TOKENS": 4,
                        "GRPO_LR": 1e-3}.items():
        monkeypatch.setattr(module, name, value)
    # The random model never wins: let the first episode of each group "win" to get a signal.
    rewards = iter([1.0, 0.0] * 4)
    monkeypatch.setattr(module, "episode_reward", lambda *args: next(rewards))
    pool = module.EnvPool(task, 0, 2)
    captured = {}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        trainer = module.build_grpo_trainer(task, model, tokenizer, rows, pool, 4096)
        original = trainer._generate_and_score_completions

        def capture(inputs):
            captured.update(original(inputs))
            return captured

        monkeypatch.setattr(trainer, "_generate_and_score_completions", capture)
        trainer.train()
    finally:
        pool.close()
    advantages = captured["advantages"].tolist()
    assert advantages == pytest.approx([0.7070, -0.7070], abs=1e-3)  # (r - mean) / (std + 1e-4)
    # The loss mask is the env_mask: the action tokens " {action}\n" of each step, not the game's text.
    mask, ids = captured["tool_mask"] * captured["completion_mask"], captured["completion_ids"]
    for row_mask, row_ids in zip(mask.tolist(), ids.tolist()):
        trained = tokenizer.decode([t for t, m in zip(row_ids, row_mask) if m])
        assert trained.count("\n") == 2 and trained.startswith(" ")  # two steps, two actions
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())


def run_agent(tmp_path, tiny_model, games, budget_s: float, **knobs):
    ws = build_workspace(tmp_path, games)
    grader = FakeGrader(ws, budget_s=budget_s)
    began = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, str(AGENTS / "sft_grpo_agent.py")], env=agent_env(ws, tiny_model, grader.url, **knobs),
            cwd=ws, capture_output=True, text=True, timeout=budget_s + 60,
        )
    finally:
        grader.stop()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert (ws / "code" / "agent" / "sft_grpo_agent.py").is_file()  # its code sits in the workspace
    assert "context mismatches" not in proc.stdout  # the rollouts' contexts were the grader's prompts
    return grader.submissions, proc.stdout, time.time() - began


def test_agent_runs_sft_then_grpo_and_submits(tmp_path, tiny_model, games):
    """The whole agent, shortened: SFT, a submission, one GRPO round, its submission."""
    submissions, stdout, _ = run_agent(
        tmp_path, tiny_model, games, 240, SFT_MAX_STEPS=1, GRPO_ROUNDS=1, GRPO_MAX_EPISODE_STEPS=2, GRPO_MAX_NEW_TOKENS=8
    )
    assert submissions == ["output/sft", "output/v1"], stdout[-3000:]
    assert "rollouts 1:" in stdout and "SFT: 1 steps" in stdout


@pytest.mark.slow
def test_agent_with_its_cpu_defaults_fits_the_default_budget(tmp_path, tiny_model, games):
    """The CPU defaults within the default 300 s budget (the fake grader scores at once)."""
    submissions, stdout, elapsed = run_agent(tmp_path, tiny_model, games, 300)
    assert submissions[0] == "output/sft" and len(submissions) >= 2, stdout[-3000:]
    assert elapsed < 300
