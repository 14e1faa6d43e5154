"""Breadth-first Sokoban solver with push semantics: optimal action count and one optimal plan."""

from __future__ import annotations

from collections import deque

from ragen.envs.sokoban.room import WALL, Room

# Action ids as the env uses them: 1 Up, 2 Down, 3 Left, 4 Right.


def _live_cells(room: Room) -> list[bool]:
    """Cells from which a lone box can still be pushed onto some target (others are dead squares)."""
    w = room.width
    free = [c != WALL for c in room.fixed]
    live = [False] * len(free)
    queue = deque(room.targets)
    for t in room.targets:
        live[t] = True
    while queue:
        cell = queue.popleft()
        for d in (-w, w, -1, 1):
            prev, player = cell - d, cell - 2 * d  # box came from prev, pushed by a player standing at player
            if 0 <= player < len(free) and free[prev] and free[player] and not live[prev]:
                live[prev] = True
                queue.append(prev)
    return live


def solve(room: Room, max_states: int = 2_000_000) -> list[int] | None:
    """Shortest action sequence that puts every box on a target, or None if none exists (within max_states)."""
    w = room.width
    free = [c != WALL for c in room.fixed]
    targets = frozenset(room.targets)
    if all(b in targets for b in room.boxes):
        return []
    live = _live_cells(room)
    deltas = ((1, -w), (2, w), (3, -1), (4, 1))
    start = (room.player, tuple(sorted(room.boxes)))
    parent: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        p, boxes = state
        for action, d in deltas:
            n = p + d
            if not free[n]:
                continue
            if n in boxes:
                beyond = n + d
                if not free[beyond] or not live[beyond] or beyond in boxes:
                    continue
                new_boxes = tuple(sorted(beyond if b == n else b for b in boxes))
            else:
                new_boxes = boxes
            nxt = (n, new_boxes)
            if nxt in parent:
                continue
            parent[nxt] = (state, action)
            if new_boxes is not boxes and all(b in targets for b in new_boxes):
                plan = []
                node: tuple[int, tuple[int, ...]] | None = nxt
                while parent[node] is not None:  # type: ignore[index]
                    node, a = parent[node]  # type: ignore[misc,index]
                    plan.append(a)
                return plan[::-1]
            if len(parent) >= max_states:
                return None
            queue.append(nxt)
    return None


def optimal_length(room: Room) -> int | None:
    plan = solve(room)
    return None if plan is None else len(plan)


__all__ = ["optimal_length", "solve"]
