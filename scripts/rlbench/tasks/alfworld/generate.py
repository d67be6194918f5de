"""Offline ALFWorld games for the official AlfredTWEnv, generated from alfworld's packaged PDDL.

No downloaded ALFWorld data is used: procedural rooms (kitchen, bathroom, bedroom, living room)
are filled with receptacles and objects, each game is written as alfworld's three files
(game.tw-pddl, traj_data.json, initial_state.pddl), and a game is kept only if alfworld's own
handcoded expert (with the pick-two fix of expert.patch_expert) wins it within 50 steps through
AlfredTWEnv's wrapper stack. The expert's commands are stored as the walkthrough.

Splits:
- "train": seen scenes (drawn from world_seed) and seen target classes;
- "heldout" (valid_unseen): unseen scenes, drawn from game_seed, none sharing a layout
  signature with a seen scene, and held-out target classes (a fraction of each task type's
  target classes, drawn from world_seed, so both splits agree on them).

Output depends only on the arguments: the same arguments give a byte-identical tree, serial or
parallel. CLI:

    python -m rlbench.tasks.alfworld.generate OUT --split heldout --world-seed 0 --game-seed 7 \\
        --counts valid_unseen --workers 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

from rlbench.tasks.alfworld import public

# -- tables ------------------------------------------------------------------------------------
TASK_TYPES = tuple(public.TASK_TYPES.values())
#: ALFWorld valid_unseen, games per task type (134 in all).
TYPE_MIX_VALID_UNSEEN = public.VALID_UNSEEN_MIX
SPLITS = ("train", "heldout")
MAX_ATTEMPTS = 200
MAX_EXPERT_STEPS = 50
SEEN_SCENES_PER_KIND = 20
UNSEEN_SCENES_PER_KIND = 5

#: Room kinds: ALFRED's floor-plan numbering base, receptacle class -> (min, max) count, and the
#: object classes that may appear (targets and distractors). Static receptacles only; movable
#: ones (Bowl, Mug, Plate, ...) are objects here.
ROOM_KINDS = {
    "kitchen": {
        "floor_plan_base": 0,
        "receptacles": {
            "Cabinet": (2, 14), "CoffeeMachine": (1, 1), "CounterTop": (1, 3), "DiningTable": (0, 2),
            "Drawer": (1, 8), "Fridge": (1, 1), "GarbageCan": (1, 1), "Microwave": (1, 1),
            "Shelf": (0, 3), "SideTable": (0, 1), "SinkBasin": (1, 1), "StoveBurner": (2, 4),
            "Toaster": (0, 1),
        },
        "objects": [
            "Apple", "Bowl", "Bread", "ButterKnife", "CellPhone", "CreditCard", "Cup", "DishSponge",
            "Egg", "Fork", "Glassbottle", "Kettle", "Knife", "Ladle", "Lettuce", "Mug", "Pan",
            "PaperTowel", "PepperShaker", "Plate", "Pot", "Potato", "SaltShaker", "SoapBottle",
            "Spatula", "Spoon", "Statue", "Tomato", "Vase", "WineBottle",
        ],
    },
    "livingroom": {
        "floor_plan_base": 200,
        "receptacles": {
            "ArmChair": (0, 2), "Cabinet": (0, 4), "CoffeeTable": (1, 2), "DiningTable": (0, 1),
            "Drawer": (0, 6), "Dresser": (0, 1), "GarbageCan": (0, 1), "Ottoman": (0, 1),
            "Safe": (0, 1), "Shelf": (0, 8), "SideTable": (0, 3), "Sofa": (1, 1), "TVStand": (0, 1),
        },
        "objects": [
            "Book", "Bowl", "Box", "Candle", "CellPhone", "CreditCard", "KeyChain", "Laptop",
            "Newspaper", "Pillow", "Plate", "RemoteControl", "Statue", "TissueBox", "Vase", "Watch",
            "WateringCan",
        ],
    },
    "bedroom": {
        "floor_plan_base": 300,
        "receptacles": {
            "ArmChair": (0, 1), "Bed": (1, 1), "Cabinet": (0, 2), "Desk": (0, 2), "Drawer": (1, 10),
            "Dresser": (0, 1), "GarbageCan": (0, 1), "LaundryHamper": (0, 1), "Safe": (0, 1),
            "Shelf": (0, 6), "SideTable": (1, 3),
        },
        "objects": [
            "AlarmClock", "BaseballBat", "BasketBall", "Book", "Bowl", "Box", "CD", "CellPhone",
            "Cloth", "CreditCard", "KeyChain", "Laptop", "Mug", "Pen", "Pencil", "Pillow",
            "TennisRacket", "TissueBox", "Vase", "Watch",
        ],
    },
    "bathroom": {
        "floor_plan_base": 400,
        "receptacles": {
            "BathtubBasin": (0, 1), "Cabinet": (1, 6), "Cart": (0, 1), "CounterTop": (1, 1),
            "Drawer": (0, 4), "Dresser": (0, 1), "GarbageCan": (1, 1), "HandTowelHolder": (0, 2),
            "Shelf": (0, 3), "SinkBasin": (1, 2), "Toilet": (1, 1), "ToiletPaperHanger": (1, 1),
            "TowelHolder": (0, 1),
        },
        "objects": [
            "Candle", "Cloth", "DishSponge", "HandTowel", "PaperTowel", "Plunger", "SoapBar",
            "SoapBottle", "SprayBottle", "TissueBox", "ToiletPaper", "Towel",
        ],
    },
}
#: ALFRED's room names (constants.GOALS_VALID) -> ours.
ROOM_KIND_OF_ALFRED = {"Kitchen": "kitchen", "LivingRoom": "livingroom", "Bedroom": "bedroom", "Bathroom": "bathroom"}
#: Not openable with this probability (otherwise every openable class starts closed).
NOT_OPENABLE_PROBABILITY = {"Drawer": 0.15}
#: The appliance a task needs, excluded as its parent receptacle.
TASK_APPLIANCE = {
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
    "pick_clean_then_place_in_recep": "SinkBasin",
}
#: The VAL_ACTION_OBJECTS property a task's target must have.
TASK_PROPERTY = {
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
    "pick_clean_then_place_in_recep": "Cleanable",
}
LAMPS = ("DeskLamp", "FloorLamp")
DESK_LAMP_PROBABILITY = 0.75
LAMP_HOLDERS = ("CoffeeTable", "Desk", "DiningTable", "Dresser", "Shelf", "SideTable")
EXTRA_LAMP_PROBABILITY = 0.3  # bedrooms and living rooms
RECEPTACLE_OBJECT_CLASSES = ("Bowl", "Cup", "Mug", "Pan", "Plate", "Pot")
#: Always declared: the domain's actions name these types.
ALWAYS_RTYPES = ("FridgeType", "MicrowaveType", "SinkBasinType")
ALWAYS_OTYPES = ("ButterKnifeType", "KnifeType")
#: Ids that alfworld renders "<x>basin": the id is "<Prefix>_bar_<coords>_bar_<Class>".
BASIN_ID_PREFIX = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}
TARGET_COUNT = {"pick_two_obj_and_place": (2, 4)}
DEFAULT_TARGET_COUNT = (1, 3)
DISTRACTOR_COUNT = (6, 18)
#: A third paraphrase per task type, beside goal_library's two templates.
EXTRA_PARAPHRASE = {
    "pick_and_place_simple": "move a {obj} to the {recep}",
    "look_at_obj_in_light": "pick up the {obj} and turn on the {toggle}",
    "pick_clean_then_place_in_recep": "wash a {obj} and put it in the {recep}",
    "pick_heat_then_place_in_recep": "warm up a {obj} and put it in the {recep}",
    "pick_cool_then_place_in_recep": "chill a {obj} and put it in the {recep}",
    "pick_two_obj_and_place": "place two {obj} in the {recep}",
}


def _alfworld():
    """alfworld's constants and goal library (imported lazily: alfworld creates $ALFWORLD_DATA)."""
    public.ensure_alfworld_data_dir()
    import alfworld.gen.constants as constants
    import alfworld.gen.goal_library as goal_library

    return constants, goal_library


def _rng(*parts) -> random.Random:
    """An RNG seeded from a readable key (str seeds hash with sha512: stable across runs)."""
    return random.Random(":".join(str(p) for p in parts))


def _int_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()[:4], "big")


# -- scenes ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Receptacle:
    cls: str
    id: str
    location: str
    openable: bool


@dataclasses.dataclass(frozen=True)
class Scene:
    kind: str
    number: int
    receptacles: tuple[Receptacle, ...]
    start: str
    signature: str

    def classes(self) -> list[str]:
        return sorted({r.cls for r in self.receptacles})


def layout_signature(kind: str, counts: dict[str, int]) -> str:
    """A room layout: its kind plus how many receptacles of each class it has."""
    return kind + ":" + ",".join(f"{cls}={n}" for cls, n in sorted(counts.items()) if n)


def _coordinate(value: float) -> str:
    return ("_minus_" if value < 0 else "_plus_") + f"{abs(value):05.2f}".replace(".", "_dot_")


def _signed(value: int) -> str:
    return f"_minus_{-value}" if value < 0 else str(value)


class _Ids:
    """Unique alfworld-style ids (Class_bar_<x>_bar_<y>_bar_<z>) and locations."""

    def __init__(self, rng: random.Random, taken: set[str] = frozenset()):
        self.rng, self.taken = rng, set(taken)

    def entity(self, cls: str) -> str:
        while True:
            xyz = (self.rng.randint(-600, 600), self.rng.randint(0, 220), self.rng.randint(-600, 600))
            coords = "_bar_".join(_coordinate(v / 100) for v in xyz)
            if cls in BASIN_ID_PREFIX:
                ident = f"{BASIN_ID_PREFIX[cls]}_bar_{coords}_bar_{cls}"
            else:
                ident = f"{cls}_bar_{coords}"
            if ident not in self.taken:
                self.taken.add(ident)
                return ident

    def location(self) -> str:
        while True:
            gx, gz = self.rng.randint(-20, 20), self.rng.randint(-20, 20)
            rot, hor = self.rng.randint(0, 3), self.rng.choice((0, 15, 30, 45, 60))
            ident = f"loc_bar_{_signed(gx)}_bar_{_signed(gz)}_bar_{rot}_bar_{hor}"
            if ident not in self.taken:
                self.taken.add(ident)
                return ident


def sample_scene(kind: str, number: int, rng: random.Random) -> Scene:
    """One room: receptacle counts from the kind's table, random unique ids and locations."""
    constants, _ = _alfworld()
    table = ROOM_KINDS[kind]["receptacles"]
    counts = {cls: rng.randint(lo, hi) for cls, (lo, hi) in sorted(table.items())}
    ids = _Ids(rng)
    receptacles = []
    for cls, n in sorted(counts.items()):
        for _ in range(n):
            openable = cls in constants.OPENABLE_CLASS_LIST and rng.random() >= NOT_OPENABLE_PROBABILITY.get(cls, 0.0)
            receptacles.append(Receptacle(cls, ids.entity(cls), ids.location(), openable))
    return Scene(kind, number, tuple(receptacles), ids.location(), layout_signature(kind, counts))


def seen_scenes(world_seed: int) -> dict[str, list[Scene]]:
    """The train scenes: SEEN_SCENES_PER_KIND per room kind, from world_seed."""
    scenes = {}
    for kind, spec in ROOM_KINDS.items():
        rng = _rng("alfworld-scenes-seen", world_seed, kind)
        scenes[kind] = [sample_scene(kind, spec["floor_plan_base"] + i + 1, rng) for i in range(SEEN_SCENES_PER_KIND)]
    return scenes


def unseen_scenes(world_seed: int, game_seed: int) -> dict[str, list[Scene]]:
    """The held-out scenes, from game_seed; none shares a layout signature with a seen scene."""
    taken = {s.signature for kind_scenes in seen_scenes(world_seed).values() for s in kind_scenes}
    scenes = {}
    for kind, spec in ROOM_KINDS.items():
        rng = _rng("alfworld-scenes-unseen", game_seed, kind)
        scenes[kind] = []
        for draw in range(10_000):
            scene = sample_scene(kind, spec["floor_plan_base"] + SEEN_SCENES_PER_KIND + len(scenes[kind]) + 1, rng)
            if scene.signature not in taken:
                taken.add(scene.signature)
                scenes[kind].append(scene)
                if len(scenes[kind]) == UNSEEN_SCENES_PER_KIND:
                    break
        else:
            raise RuntimeError(f"could not draw {UNSEEN_SCENES_PER_KIND} unseen {kind} layouts")
    return scenes


# -- target classes ----------------------------------------------------------------------------
def task_room_kinds(task_type: str) -> list[str]:
    constants, _ = _alfworld()
    return sorted(ROOM_KIND_OF_ALFRED[k] for k in constants.GOALS_VALID[task_type])


def _contains(receptacle_cls: str, object_cls: str) -> bool:
    constants, _ = _alfworld()
    return object_cls in constants.VAL_RECEPTACLE_OBJECTS.get(receptacle_cls, ())


def task_target_classes(task_type: str) -> list[str]:
    """Every object class a task type may target (before the seen/held-out split)."""
    constants, _ = _alfworld()
    classes = set()
    for kind in task_room_kinds(task_type):
        for obj in ROOM_KINDS[kind]["objects"]:
            if task_type in TASK_PROPERTY and obj not in constants.VAL_ACTION_OBJECTS[TASK_PROPERTY[task_type]]:
                continue
            classes.add(obj)
    return sorted(classes)


def heldout_target_classes(world_seed: int, fraction: float) -> dict[str, list[str]]:
    """The target classes reserved for the held-out split: `fraction` of each type's, from world_seed."""
    held = {}
    for task_type in TASK_TYPES:
        classes = task_target_classes(task_type)
        k = round(fraction * len(classes))
        held[task_type] = sorted(_rng("alfworld-heldout-targets", world_seed, task_type).sample(classes, k))
    return held


def split_target_classes(split: str, world_seed: int, fraction: float) -> dict[str, list[str]]:
    """Per task type, the target classes of a split (held-out ones for "heldout", the rest for "train").
    With fraction 0 both splits use every class (only the scenes differ)."""
    held = heldout_target_classes(world_seed, fraction)
    pools = {}
    for task_type in TASK_TYPES:
        if not held[task_type]:
            pools[task_type] = task_target_classes(task_type)
        elif split == "heldout":
            pools[task_type] = held[task_type]
        else:
            pools[task_type] = [c for c in task_target_classes(task_type) if c not in held[task_type]]
    return pools


# -- games -------------------------------------------------------------------------------------
@dataclasses.dataclass
class GameSpec:
    """One sampled game, before validation."""

    task_type: str
    scene: Scene
    target: str
    parent: str  # "" for look tasks
    toggle: str  # "" unless look
    objects: list[tuple[str, str, Receptacle]]  # (class, id, receptacle), targets first


def _confusable(a: str, b: str) -> bool:
    # The expert tests "take <cls>" by substring: "take pot" matches "take potato 1 ...".
    a, b = a.lower(), b.lower()
    return a != b and (a.startswith(b) or b.startswith(a))


def sample_game(task_type: str, scenes: dict[str, list[Scene]], targets: list[str], rng: random.Random) -> GameSpec:
    """Draw a target class (uniformly), then a room that has it, a parent (or lamp), the target
    instances and the distractors."""
    for _ in range(1000):
        target = rng.choice(targets)
        kinds = [k for k in task_room_kinds(task_type) if target in ROOM_KINDS[k]["objects"]]
        scene = rng.choice(scenes[rng.choice(kinds)])
        spec = _sample_in_scene(task_type, scene, target, rng)
        if spec is not None:
            return spec
    raise RuntimeError(f"no feasible {task_type} game for targets {targets}")


def _sample_in_scene(task_type: str, scene: Scene, target: str, rng: random.Random) -> GameSpec | None:
    ids = _Ids(rng, {r.id for r in scene.receptacles})
    lamps: list[tuple[str, str, Receptacle]] = []
    parent = toggle = ""
    if task_type == "look_at_obj_in_light":
        holders = [r for r in scene.receptacles if r.cls in LAMP_HOLDERS]
        if not holders:
            return None
        toggle = "DeskLamp" if rng.random() < DESK_LAMP_PROBABILITY else "FloorLamp"
        lamp_at = rng.choice(holders)
        lamps.append((toggle, ids.entity(toggle), lamp_at))
        spots = [r for r in scene.receptacles if _contains(r.cls, target) and r is not lamp_at]
    else:
        if task_type in TASK_APPLIANCE and TASK_APPLIANCE[task_type] not in scene.classes():
            return None
        parents = [c for c in scene.classes() if _contains(c, target) and c != TASK_APPLIANCE.get(task_type)]
        if not parents:
            return None
        parent = rng.choice(parents)
        spots = [r for r in scene.receptacles if _contains(r.cls, target) and r.cls != parent]
    if not spots:  # the goal must not hold at reset: targets never start in a parent-class receptacle
        return None
    lo, hi = TARGET_COUNT.get(task_type, DEFAULT_TARGET_COUNT)
    objects = [(target, ids.entity(target), rng.choice(spots)) for _ in range(rng.randint(lo, hi))]

    present = {target, parent, toggle} - {""}
    pool = [c for c in ROOM_KINDS[scene.kind]["objects"] if c != target]
    for _ in range(rng.randint(*DISTRACTOR_COUNT)):
        cls = rng.choice(pool)
        places = [r for r in scene.receptacles if _contains(r.cls, cls)]
        if not places or any(_confusable(cls, other) for other in sorted(present)):
            continue
        present.add(cls)
        objects.append((cls, ids.entity(cls), rng.choice(places)))
    if scene.kind in ("bedroom", "livingroom") and rng.random() < EXTRA_LAMP_PROBABILITY:
        holders = [r for r in scene.receptacles if r.cls in LAMP_HOLDERS]
        if holders:
            extra = rng.choice(LAMPS)
            lamps.append((extra, ids.entity(extra), rng.choice(holders)))
    return GameSpec(task_type, scene, target, parent, toggle, objects + lamps)


# -- PDDL, grammar and traj_data ---------------------------------------------------------------
def problem_pddl(spec: GameSpec, problem_name: str) -> str:
    """initial_state.pddl: objects, initial facts and the goal_library goal of the task."""
    constants, goal_library = _alfworld()
    scene = spec.scene
    object_classes = sorted({cls for cls, _, _ in spec.objects})
    recep_classes = sorted({r.cls for r in scene.receptacles})
    otypes = sorted({f"{c}Type" for c in object_classes} | set(ALWAYS_OTYPES))
    rtypes = sorted({f"{c}Type" for c in recep_classes} | set(ALWAYS_RTYPES))
    locations = sorted({r.location for r in scene.receptacles} | {scene.start})
    location_of = {r.id: r.location for r in scene.receptacles}

    declarations = ["agent1 - agent"]
    declarations += [f"{t} - otype" for t in otypes] + [f"{t} - rtype" for t in rtypes]
    declarations += [f"{oid} - object" for _, oid, _ in sorted(spec.objects, key=lambda o: o[1])]
    declarations += [f"{r.id} - receptacle" for r in sorted(scene.receptacles, key=lambda r: r.id)]
    declarations += [f"{loc} - location" for loc in locations]

    facts = []
    for r in sorted(scene.receptacles, key=lambda r: r.id):
        facts.append(f"(receptacleType {r.id} {r.cls}Type)")
        if r.openable:
            facts.append(f"(openable {r.id})")
        facts.append(f"(receptacleAtLocation {r.id} {r.location})")
    actions = constants.VAL_ACTION_OBJECTS
    for cls, oid, recep in sorted(spec.objects, key=lambda o: o[1]):
        facts.append(f"(objectType {oid} {cls}Type)")
        if cls in LAMPS:
            facts.append(f"(toggleable {oid})")
        else:
            facts.append(f"(pickupable {oid})")
        if cls in RECEPTACLE_OBJECT_CLASSES:
            facts.append(f"(isReceptacleObject {oid})")
        for prop in ("Heatable", "Coolable", "Cleanable", "Sliceable"):
            if cls in actions[prop]:
                facts.append(f"({prop.lower()} {oid})")
        facts.append(f"(inReceptacle {oid} {recep.id})")
        facts.append(f"(objectAtLocation {oid} {location_of[recep.id]})")
    facts.append(f"(atLocation agent1 {scene.start})")
    for rc in recep_classes:
        for oc in object_classes:
            if _contains(rc, oc):
                facts.append(f"(canContain {rc}Type {oc}Type)")

    goal = goal_library.gdict[spec.task_type]["pddl"].format(
        obj=spec.target, recep=spec.parent, toggle=spec.toggle, mrecep=""
    ).replace("#", "-")
    return (
        f"(define (problem {problem_name})\n(:domain alfred)\n(:objects\n"
        + "".join(f"    {d}\n" for d in declarations)
        + "    )\n(:init\n"
        + "".join(f"    {f}\n" for f in facts)
        + "    )\n"
        + goal.strip()
        + "\n"
    )


@contextlib.contextmanager
def _seeded_global_random(seed: int):
    # alfworld's templated goal text draws from the global `random`.
    saved = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved)


def game_files(spec: GameSpec, *, split: str, index: int, attempt: int, seed: int) -> tuple[dict, dict, str, str]:
    """(game.tw-pddl data without walkthrough, traj_data, initial_state.pddl text, goal text)."""
    public.ensure_alfworld_data_dir()
    from alfworld.agents.utils.misc import add_task_to_grammar
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    _, goal_library = _alfworld()
    task_id = f"{split}-{index:04d}"
    fill = {"obj": spec.target.lower(), "recep": spec.parent.lower(), "toggle": spec.toggle.lower(), "mrecep": ""}
    paraphrases = [t.format(**fill) for t in goal_library.gdict[spec.task_type]["templates"]]
    paraphrases.append(EXTRA_PARAPHRASE[spec.task_type].format(**fill))
    traj_data = {
        "task_id": task_id,
        "task_type": spec.task_type,
        "pddl_params": {
            "object_target": spec.target,
            "parent_target": spec.parent,
            "toggle_target": spec.toggle,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": p} for p in paraphrases]},
        "scene": {
            "scene_num": spec.scene.number,
            "floor_plan": f"FloorPlan{spec.scene.number}",
            "room_kind": spec.scene.kind,
            "layout_signature": spec.scene.signature,
        },
        "generator": {"split": split, "index": index, "attempt": attempt},
    }
    problem = problem_pddl(spec, f"plan_{task_id.replace('-', '_')}")
    grammar_template = Path(ALFRED_TWL2_PATH).read_text()
    with _seeded_global_random(seed):
        grammar = add_task_to_grammar(grammar_template, traj_data, 0.0, rng=random.Random(seed))
    goal = _goal_text(grammar_template, grammar)
    game = {
        "pddl_domain": Path(ALFRED_PDDL_PATH).read_text(),
        "grammar": grammar,
        "pddl_problem": problem,
        "solvable": True,
        "walkthrough": None,
    }
    return game, traj_data, problem, goal


def _goal_text(template: str, grammar: str) -> str:
    head, _, tail = template.partition("UNKNOWN GOAL")
    return grammar[len(head) : len(grammar) - len(tail)]


def game_dir_name(record: dict) -> str:
    """<task_type>-<Object>-None-<Parent|Lamp>-<scene>, as in ALFWorld's json_2.1.1 tree."""
    second = record["toggle"] or record["parent"]
    return f"{record['task_type']}-{record['object']}-None-{second}-{record['scene']}"


def _dumps(data) -> str:
    return json.dumps(data, sort_keys=True, indent=1) + "\n"


# -- validation --------------------------------------------------------------------------------
def _init_worker() -> None:
    public.ensure_alfworld_data_dir()
    public.speed_up_textworld()
    from rlbench.tasks.alfworld.expert import patch_expert

    patch_expert()


@dataclasses.dataclass(frozen=True)
class GameJob:
    split: str
    index: int
    task_type: str
    game_seed: int
    scenes: dict
    targets: tuple
    max_expert_steps: int


def build_game(job: GameJob) -> dict:
    """Sample and validate one game, re-sampling (attempt-derived seeds) until the expert wins.

    Returns the game's files (as text) and its manifest record."""
    from rlbench.tasks.alfworld.expert import expert_trajectory

    _init_worker()
    started = time.perf_counter()
    failures = Counter()
    for attempt in range(MAX_ATTEMPTS):
        key = ("alfworld-game", job.split, job.game_seed, job.index, attempt)
        spec = sample_game(job.task_type, job.scenes, list(job.targets), _rng(*key))
        seed = _int_seed(*key)
        game, traj_data, problem, goal = game_files(spec, split=job.split, index=job.index, attempt=attempt, seed=seed)
        with tempfile.TemporaryDirectory(prefix="alfworld-validate-") as tmp:
            trial = Path(tmp) / "game" / "trial_0"
            trial.mkdir(parents=True)
            (trial / "game.tw-pddl").write_text(_dumps(game))
            (trial / "traj_data.json").write_text(_dumps(traj_data))
            (trial / "initial_state.pddl").write_text(problem)
            result = expert_trajectory(trial / "game.tw-pddl", max_steps=job.max_expert_steps, seed=seed)
        if "error" in result or not result["won"]:
            failures[result.get("error", "not won").split(":")[0]] += 1
            continue
        game["walkthrough"] = [step["action"] for step in result["trajectory"]]
        record = {
            "index": job.index,
            "task_type": job.task_type,
            "object": spec.target,
            "parent": spec.parent,
            "toggle": spec.toggle,
            "room_kind": spec.scene.kind,
            "scene": spec.scene.number,
            "layout_signature": spec.scene.signature,
            "goal": goal,
            "attempt": attempt,
            "num_receptacles": len(spec.scene.receptacles),
            "num_objects": len(spec.objects),
            "expert_steps": result["steps"],
            "initial_observation": result["initial_observation"],
            "trajectory": result["trajectory"],
        }
        files = {"game.tw-pddl": _dumps(game), "traj_data.json": _dumps(traj_data), "initial_state.pddl": problem}
        return {"record": record, "files": files, "seconds": time.perf_counter() - started}
    raise RuntimeError(
        f"{job.split} game {job.index} ({job.task_type}): the expert won none of {MAX_ATTEMPTS} sampled games "
        f"within {job.max_expert_steps} steps (failures: {dict(failures)})"
    )


# -- orchestration -----------------------------------------------------------------------------
def parse_counts(text: str) -> dict[str, int]:
    """'valid_unseen', or 'pick_and_place_simple=2,look_at_obj_in_light=1,...', or 'all=N'."""
    if text == "valid_unseen":
        return dict(TYPE_MIX_VALID_UNSEEN)
    counts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name == "all":
            counts.update({t: int(value) for t in TASK_TYPES})
        elif name in TASK_TYPES:
            counts[name] = int(value)
        else:
            raise ValueError(f"unknown task type {name!r} in --counts; known: all, {', '.join(TASK_TYPES)}")
    return counts


def generate_games(
    out_dir: Path,
    *,
    split: str,
    world_seed: int,
    game_seed: int,
    counts: dict[str, int],
    workers: int = 1,
    heldout_fraction: float = 0.25,
    max_expert_steps: int = MAX_EXPERT_STEPS,
    stats_path: Path | None = None,
) -> dict:
    """Generate, validate and write one split's games under out_dir (see the module docstring).

    Writes out_dir/<task>-<Obj>-None-<Parent|Lamp>-<scene>/trial_<k>/{game.tw-pddl, traj_data.json,
    initial_state.pddl} and out_dir/manifest.json; timings go only to stats_path (if given) and
    the returned dict. Same arguments give a byte-identical tree, whatever `workers`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}")
    unknown = sorted(set(counts) - set(TASK_TYPES))
    if unknown:
        raise ValueError(f"unknown task types {unknown}; known: {list(TASK_TYPES)}")
    if not 0 <= heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be in [0, 1); got {heldout_fraction}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty; generate into a new folder")
    started = time.perf_counter()

    scenes = seen_scenes(world_seed) if split == "train" else unseen_scenes(world_seed, game_seed)
    targets = split_target_classes(split, world_seed, heldout_fraction)
    empty = [t for t in TASK_TYPES if counts.get(t, 0) and not targets[t]]
    if empty:
        raise ValueError(f"heldout_fraction={heldout_fraction} leaves no {split} target classes for {empty}; lower it")
    jobs = []
    for task_type in TASK_TYPES:  # a fixed plan: games in task-type order, then by index
        room_scenes = {k: scenes[k] for k in task_room_kinds(task_type)}
        pool = tuple(targets[task_type])
        for _ in range(counts.get(task_type, 0)):
            jobs.append(GameJob(split, len(jobs), task_type, game_seed, room_scenes, pool, max_expert_steps))
    results = _run_jobs(jobs, workers)

    out_dir.mkdir(parents=True, exist_ok=True)
    records, trials = [], Counter()
    for result in results:
        record = dict(result["record"])
        name = game_dir_name(record)
        trial_dir = out_dir / name / f"trial_{trials[name]}"
        trials[name] += 1
        trial_dir.mkdir(parents=True)
        for filename, text in result["files"].items():
            (trial_dir / filename).write_text(text)
        record["path"] = (trial_dir / "game.tw-pddl").relative_to(out_dir).as_posix()
        records.append(record)

    summary = _summary(records)
    manifest = {
        "split": split,
        "world_seed": world_seed,
        "heldout_fraction": heldout_fraction,
        "max_expert_steps": max_expert_steps,
        "counts": {t: counts.get(t, 0) for t in TASK_TYPES},
        "layout_signatures": sorted({s.signature for kind in scenes.values() for s in kind}),
        "scenes": sorted(s.number for kind in scenes.values() for s in kind),
        "target_classes": targets,
        "summary": summary,
        "games": records,
    }
    (out_dir / "manifest.json").write_text(_dumps(manifest))

    seconds = time.perf_counter() - started
    stats = {
        "games": len(records),
        "workers": workers,
        "seconds": round(seconds, 2),
        "seconds_per_game": round(seconds / max(1, len(records)), 3),
        "game_seconds": [round(r["seconds"], 3) for r in results],
        "attempts": summary["attempts"],
    }
    if stats_path is not None:
        Path(stats_path).write_text(_dumps(stats))
    return {"out_dir": str(out_dir), "summary": summary, **stats}


def _run_jobs(jobs: list[GameJob], workers: int) -> list[dict]:
    if workers <= 1 or len(jobs) <= 1:
        with _kept_argv():
            return [build_game(job) for job in jobs]
    # spawn: never fork a process that may have imported torch or holds threads. A dead worker
    # breaks the executor (BrokenProcessPool) instead of being respawned forever, as Pool does.
    context = multiprocessing.get_context("spawn")
    executor = concurrent.futures.ProcessPoolExecutor(
        min(workers, len(jobs)), mp_context=context, initializer=_init_worker
    )
    try:
        with _without_main_module():  # workers start on submit
            futures = [executor.submit(build_game, job) for job in jobs]
        return [future.result() for future in futures]  # index order
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _without_main_module():
    """Hide the parent's __main__ (a Snakemake script, a notebook, stdin) from spawned workers:
    spawn re-imports it in each child, which re-runs an unguarded script. Workers need only
    this module."""
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


@contextlib.contextmanager
def _kept_argv():
    saved = list(sys.argv)  # Fast Downward overwrites sys.argv on each load and reset
    try:
        yield
    finally:
        sys.argv[:] = saved


def _summary(records: list[dict]) -> dict:
    def spread(values):
        return {"min": min(values), "mean": round(statistics.mean(values), 2), "max": max(values)} if values else {}

    return {
        "games": len(records),
        "per_task_type": {t: sum(r["task_type"] == t for r in records) for t in TASK_TYPES},
        "per_room_kind": dict(sorted(Counter(r["room_kind"] for r in records).items())),
        "expert_steps": spread([r["expert_steps"] for r in records]),
        "receptacles": spread([r["num_receptacles"] for r in records]),
        "objects": spread([r["num_objects"] for r in records]),
        "attempts": sum(r["attempt"] + 1 for r in records),
        "scenes_used": len({r["scene"] for r in records}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate validated offline ALFWorld games.")
    parser.add_argument("out", type=Path, help="output folder (new or empty)")
    parser.add_argument("--split", choices=SPLITS, required=True)
    parser.add_argument("--world-seed", type=int, default=0, help="public: seen scenes and held-out classes")
    parser.add_argument("--game-seed", type=int, default=0, help="games (and, for heldout, the unseen scenes)")
    parser.add_argument(
        "--counts", default=None, help="'valid_unseen' (default for heldout), 'all=N' or 'type=N,...' (default all=20)"
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--heldout-fraction", type=float, default=0.25)
    parser.add_argument("--max-expert-steps", type=int, default=MAX_EXPERT_STEPS)
    parser.add_argument("--stats", type=Path, default=None, help="write timings here (JSON)")
    args = parser.parse_args(argv)  # before any env exists: Fast Downward overwrites sys.argv
    counts = parse_counts(args.counts or ("valid_unseen" if args.split == "heldout" else "all=20"))
    result = generate_games(
        args.out,
        split=args.split,
        world_seed=args.world_seed,
        game_seed=args.game_seed,
        counts=counts,
        workers=args.workers,
        heldout_fraction=args.heldout_fraction,
        max_expert_steps=args.max_expert_steps,
        stats_path=args.stats,
    )
    print(json.dumps({k: v for k, v in result.items() if k != "game_seconds"}, indent=1, sort_keys=True))


if __name__ == "__main__":
    # Run the importable module's main, so that worker processes can unpickle its jobs.
    from rlbench.tasks.alfworld.generate import main as module_main

    module_main()
