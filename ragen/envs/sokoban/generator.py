"""Room generator: random-walk topology + reverse-play search (gym-sokoban's method, as RAGEN runs it).

All randomness comes from the ``numpy.random.Generator`` passed in. The search works on flat cell indices and
tuples instead of numpy arrays: rooms are tiny, and per-cell numpy calls would dominate the run time.
"""

from __future__ import annotations

import numpy as np

from ragen.envs.sokoban.room import FLOOR, TARGET, WALL, Room

# The 5 stamp shapes of the topology walk (3x3, row-major), as (dr, dc) offsets of their floor cells.
_MASKS = (
    ((0, 0, 0), (1, 1, 1), (0, 0, 0)),
    ((0, 1, 0), (0, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (0, 1, 0)),
    ((0, 0, 0), (1, 1, 0), (1, 1, 0)),
    ((0, 0, 0), (0, 1, 1), (0, 1, 0)),
)
_MASK_CELLS = tuple(tuple((r, c) for r in range(3) for c in range(3) if m[r][c]) for m in _MASKS)
_WALK_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))
P_CHANGE_DIRECTION = 0.35
MAX_EXPLORED_STATES = 300_000


class GenerationError(RuntimeError):
    """No room with a positive score was found."""


def default_gen_steps(height: int, width: int) -> int:
    return int(1.7 * (height + width))


def room_topology(height: int, width: int, num_steps: int, rng: np.random.Generator) -> list[int]:
    """Random walk stamping 3x3 floor masks; returns flat cells (1 floor, 0 wall) with a wall border."""
    level = [WALL] * (height * width)
    change = rng.random(num_steps)
    new_dirs = rng.integers(4, size=num_steps)
    masks = rng.integers(len(_MASK_CELLS), size=num_steps)
    dr, dc = _WALK_DIRECTIONS[int(rng.integers(4))]
    r = int(rng.integers(1, height - 1))
    c = int(rng.integers(1, width - 1))
    for s in range(num_steps):
        if change[s] < P_CHANGE_DIRECTION:
            dr, dc = _WALK_DIRECTIONS[new_dirs[s]]
        r = min(max(r + dr, 1), height - 2)
        c = min(max(c + dc, 1), width - 2)
        for mr, mc in _MASK_CELLS[masks[s]]:
            level[(r - 1 + mr) * width + (c - 1 + mc)] = FLOOR
    for col in range(width):
        level[col] = level[(height - 1) * width + col] = WALL
    for row in range(height):
        level[row * width] = level[row * width + width - 1] = WALL
    return level


def place_player_and_targets(level: list[int], num_boxes: int, rng: np.random.Generator) -> tuple[int, list[int]]:
    """Player on a random floor cell, then ``num_boxes`` targets on random remaining floor cells."""
    free = [i for i, c in enumerate(level) if c == FLOOR]
    if len(free) <= num_boxes + 1:
        raise GenerationError(f"not enough free cells ({len(free)}) for 1 player and {num_boxes} boxes")
    player = free.pop(int(rng.integers(len(free))))
    targets = [free.pop(int(rng.integers(len(free)))) for _ in range(num_boxes)]
    return player, targets


def reverse_play(free: list[bool], width: int, player: int, targets: list[int], search_depth: int,
                 max_states: int = MAX_EXPLORED_STATES) -> tuple[int, tuple[int, ...], int]:
    """Depth-first reverse play from the solved state, expanding only the 4 pull actions.

    Visits states in the same order as the original recursive search (a state is taken when first reached,
    ``ttl`` counts the depth budget, at most ``max_states`` distinct states). A state's score is
    (box swaps along its path) x (summed Manhattan distance of boxes from their own targets), and 0 unless every
    target is empty (no box on it, no player on it). Returns (player, boxes by origin target, best score).
    """
    n_boxes = len(targets)
    deltas = (-width, width, -1, 1)  # pull up, down, left, right
    explored: set[tuple[int, tuple[int, ...]]] = set()
    best: tuple[int, tuple[int, ...]] = (player, tuple(targets))
    best_score = 0
    target_rc = [divmod(t, width) for t in targets]
    stack: list[tuple[int, tuple[int, ...], int, int, int]] = [(player, tuple(targets), 0, -1, search_depth)]
    pop, push = stack.pop, stack.append
    while stack:
        p, boxes, swaps, last, ttl = pop()
        ttl -= 1
        if ttl <= 0 or len(explored) >= max_states:
            continue
        key = (p, boxes if n_boxes == 1 else tuple(sorted(boxes)))
        if key in explored:
            continue
        explored.add(key)
        if swaps and p not in targets and not any(b in targets for b in boxes):
            disp = 0
            for b, (tr, tc) in zip(boxes, target_rc, strict=True):
                br, bc = divmod(b, width)
                disp += abs(br - tr) + abs(bc - tc)
            score = swaps * disp
            if score > best_score:
                best_score, best = score, (p, boxes)
        children = []
        for d in deltas:
            nxt = p + d
            if not free[nxt] or nxt in boxes:
                continue
            behind = p - d
            if behind in boxes:
                i = boxes.index(behind)
                children.append((nxt, boxes[:i] + (p,) + boxes[i + 1:], swaps + (i != last), i, ttl))
            else:
                children.append((nxt, boxes, swaps, last, ttl))
        for child in reversed(children):
            push(child)
    return best[0], best[1], best_score


def _wander_player(free: list[bool], width: int, player: int, boxes: tuple[int, ...], score_disp: int,
                   rng: np.random.Generator) -> int:
    """RAGEN's post-processing: maybe walk the player 1-3 random steps away from the last pulled box."""
    if rng.random() >= (0.8 if score_disp == 1 else 0.5):
        return player
    visited = {player}
    for _ in range(3):
        options = [player + d for d in (-width, width, -1, 1)
                   if free[player + d] and player + d not in boxes and player + d not in visited]
        if not options:
            break
        player = options[int(rng.integers(len(options)))]
        visited.add(player)
        if rng.random() >= 0.5:
            break
    return player


def generate_room(dim: tuple[int, int], num_boxes: int, search_depth: int, rng: np.random.Generator,
                  num_gen_steps: int | None = None, tries: int = 4, max_rounds: int = 64) -> Room:
    """Generate a solvable room. Each round makes ``tries`` attempts (the original's loop); where the original
    re-seeded with a salted ``hash()``, further rounds simply continue the same generator: deterministic."""
    height, width = dim
    if height < 3 or width < 3:
        raise ValueError(f"dim must be at least (3, 3), got {dim}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    if search_depth < 2:
        raise ValueError(f"search_depth must be >= 2, got {search_depth}")
    steps = default_gen_steps(height, width) if num_gen_steps is None else num_gen_steps
    for _ in range(max_rounds * tries):
        level = room_topology(height, width, steps, rng)
        try:
            player, targets = place_player_and_targets(level, num_boxes, rng)
        except GenerationError:
            continue
        free = [c != WALL for c in level]
        p, boxes, score = reverse_play(free, width, player, targets, search_depth)
        if score <= 0:
            continue
        disp = sum(abs(b // width - t // width) + abs(b % width - t % width)
                   for b, t in zip(boxes, targets, strict=True))
        p = _wander_player(free, width, p, boxes, disp, rng)
        fixed = list(level)
        for t in targets:
            fixed[t] = TARGET
        return Room(height, width, tuple(fixed), p, tuple(sorted(boxes)))
    raise GenerationError(
        f"no solvable room found for dim={dim}, num_boxes={num_boxes}, search_depth={search_depth} after "
        f"{max_rounds * tries} attempts; use fewer boxes or a larger room")
