"""Sokoban room data: cell codes, the Room value type and text rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)

DEFAULT_GRID_LOOKUP: dict[int, str] = {0: "#", 1: "_", 2: "O", 3: "√", 4: "X", 5: "P", 6: "S"}
DEFAULT_GRID_VOCAB: dict[str, str] = {
    "#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box", "P": "player",
    "S": "player on target",
}
CELL_NAMES = {0: "wall", 1: "empty", 2: "target", 3: "box on target", 4: "box", 5: "player", 6: "player on target"}

ACTION_LOOKUP: dict[int, str] = {1: "Up", 2: "Down", 3: "Left", 4: "Right"}


def grid_vocab_for(lookup: Mapping[int, str]) -> dict[str, str]:
    """Glossary that matches a grid lookup (symbol -> meaning)."""
    return {lookup[code]: CELL_NAMES[code] for code in sorted(CELL_NAMES)}


@dataclass(frozen=True)
class Room:
    """A Sokoban room on a flat row-major grid of ``height * width`` cells.

    ``fixed[i]`` is WALL, FLOOR or TARGET; ``boxes`` and ``player`` are cell indices.
    """

    height: int
    width: int
    fixed: tuple[int, ...]
    player: int
    boxes: tuple[int, ...]

    @property
    def targets(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.fixed) if c == TARGET)

    def codes(self) -> list[int]:
        """Per-cell render codes 0..6."""
        cells = list(self.fixed)
        for b in self.boxes:
            cells[b] = BOX_ON_TARGET if self.fixed[b] == TARGET else BOX
        cells[self.player] = PLAYER_ON_TARGET if self.fixed[self.player] == TARGET else PLAYER
        return cells

    def render(self, lookup: Mapping[int, str] = DEFAULT_GRID_LOOKUP) -> str:
        cells = [lookup.get(c, "?") for c in self.codes()]
        w = self.width
        return "\n".join("".join(cells[r * w:(r + 1) * w]) for r in range(self.height))

    @property
    def boxes_on_target(self) -> int:
        return sum(1 for b in self.boxes if self.fixed[b] == TARGET)

    @classmethod
    def parse(cls, text: str, lookup: Mapping[int, str] = DEFAULT_GRID_LOOKUP) -> Room:
        """Build a room from its text rendering (for tests, demos and hand-made levels)."""
        rev = {sym: code for code, sym in lookup.items()}
        rows = text.strip("\n").split("\n")
        if len({len(r) for r in rows}) != 1:
            raise ValueError("room text: all rows must have the same length")
        fixed: list[int] = []
        boxes: list[int] = []
        players: list[int] = []
        for r, row in enumerate(rows):
            for c, sym in enumerate(row):
                if sym not in rev:
                    raise ValueError(f"room text: unknown symbol {sym!r} at row {r}, column {c}")
                code = rev[sym]
                i = r * len(row) + c
                fixed.append(TARGET if code in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET)
                             else WALL if code == WALL else FLOOR)
                if code in (BOX, BOX_ON_TARGET):
                    boxes.append(i)
                if code in (PLAYER, PLAYER_ON_TARGET):
                    players.append(i)
        if len(players) != 1:
            raise ValueError(f"room text: expected exactly one player, found {len(players)}")
        n_targets = sum(1 for c in fixed if c == TARGET)
        if n_targets != len(boxes):
            raise ValueError(f"room text: {len(boxes)} boxes but {n_targets} targets")
        h, w = len(rows), len(rows[0])
        for i, c in enumerate(fixed):
            r, col = divmod(i, w)
            if c != WALL and (r in (0, h - 1) or col in (0, w - 1)):
                raise ValueError("room text: the border must be wall")
        return cls(h, w, tuple(fixed), players[0], tuple(sorted(boxes)))
