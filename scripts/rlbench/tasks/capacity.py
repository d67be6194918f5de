"""What a task's data source can give its splits, checked against the sizes a config asks for.

Each task states it (Task.split_capacity, Task.split_sizes): the number of operand pairs, problems, rows
of a hub split or questions a generated knowledge base can ask. The workflow checks every task of the
sweep when it validates the config (rules/common.smk: rlbench.config.validate_config with
rlbench.tasks.split_size_problems), so a config that cannot work stops before any rule runs: before a
training split is rewritten, a finished run archived or a held-out split lost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitCapacity:
    """The most items a task's data source can give its splits, known before any data are built.

    source: what gives the items, with how many, as the messages name it ("the 4,095 operand pairs ...");
    train / eval: the most each split can hold (None: no bound known before the data are built);
    total: the most both can hold together, where they are drawn, disjoint, from one pool;
    grows_with: the setting that makes the source larger, if any (kb_size, catalogue_size).
    """

    source: str
    train: int | None = None
    eval: int | None = None
    total: int | None = None
    grows_with: str | None = None


def size_problems(
    name: str, source: str | None, sizes: tuple[int | None, int | None], capacity: SplitCapacity | None
) -> list[str]:
    """What is wrong with the split sizes `sizes` (train, eval; None: all the source gives) of task `name`
    given its source's `capacity` (None: no bound), one message per problem, each saying what to change."""
    if capacity is None:
        return []
    train, held_out = sizes
    where = f"task {name!r} (source: {source})"
    key = f"tasks.{name}"
    grow = f", or raise {key}.{capacity.grows_with}" if capacity.grows_with else ""
    problems = []
    for split, size, most in (("train", train, capacity.train), ("eval", held_out, capacity.eval)):
        if size is not None and most is not None and size > most:
            which = "training" if split == "train" else "held-out"
            problems.append(
                f"{where}: {split}_size {size} asks for more {which} items than {capacity.source} can give "
                f"({most:,}); set {key}.{split}_size to at most {most}{grow}"
            )
    if capacity.total is not None and train is not None and held_out is not None and train + held_out > capacity.total:
        problems.append(
            f"{where}: train_size {train} + eval_size {held_out} = {train + held_out}, but the two splits are "
            f"drawn, disjoint, from {capacity.source}; lower {key}.train_size or "
            f"{key}.eval_size so that they add up to at most {capacity.total}{grow}"
        )
    return problems
