"""Chat rendering to token ids through the tokenizer's own chat template, splicing sampled ids in verbatim.

Each message's content is rendered as a unique sentinel; the template text around the sentinels is tokenised,
and every content is either tokenised text or, for token-in/token-out assistant turns, the exact ids the engine
sampled. Each token carries its kind and owning message, from which masks and reward positions follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    TEMPLATE = 0  # role headers and separators written by the chat template
    SYSTEM = 1
    USER = 2
    PREFIX = 3  # forced "<think>" / "<answer>" prefix: in the prompt, not sampled
    SAMPLED = 4  # ids exactly as the engine sampled them
    ASSISTANT = 5  # assistant text re-tokenised (response_storage: rebuilt)
    END_OF_TURN = 6  # the template's end-of-turn token closing an assistant message


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant
    text: str = ""
    sampled_ids: tuple[int, ...] | None = None  # assistant turns stored token-in/token-out
    prefix: str = ""  # forced prefix that preceded the sampled ids

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            raise ValueError(f"message role must be system, user or assistant, got {self.role!r}")
        if self.sampled_ids is not None and self.role != "assistant":
            raise ValueError("only assistant messages can hold sampled ids")


@dataclass
class Rendered:
    ids: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)  # index of the message a token belongs to

    def extend(self, ids: Sequence[int], kinds: Sequence[int], owners: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.kinds.extend(kinds)
        self.owners.extend(owners)

    def assistant_turn_ends(self, kinds: Sequence[int]) -> list[int]:
        """Index of the last token of each assistant message among tokens of the given kinds."""
        ends: dict[int, int] = {}
        for i, (k, o) in enumerate(zip(self.kinds, self.owners, strict=True)):
            if k in kinds:
                ends[o] = i
        return [ends[o] for o in sorted(ends)]


def _sentinel(i: int) -> str:
    return f"\ue000{i}\ue001"  # private-use code points: no template touches them


class ChatRenderer:
    """Renders message lists to ids with per-token kinds, using the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; use an instruct model's tokenizer")
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        eot_id = tokenizer.convert_tokens_to_ids(self.end_of_turn)
        if eot_id is None or eot_id == getattr(tokenizer, "unk_token_id", -1):
            raise ValueError(f"end-of-turn token {self.end_of_turn!r} is not in the tokenizer's vocabulary")
        self.end_of_turn_id = int(eot_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _template(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[str]:
        chat = [{"role": m.role, "content": _sentinel(i)} for i, m in enumerate(messages)]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
        pieces = []
        for i in range(len(messages)):
            head, sep, text = text.partition(_sentinel(i))
            if not sep or _sentinel(i) in text:
                raise ValueError("the chat template must render every message content exactly once, in order")
            pieces.append(head)
        pieces.append(text)
        return pieces

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False,
               generation_prefix: str = "") -> Rendered:
        pieces = self._template(messages, add_generation_prompt)
        out = Rendered()
        run: list[tuple[str, int, int]] = []  # (text, kind, owner) waiting to be tokenised together

        def flush() -> None:
            if run:
                self._tokenize_run(run, out)
                run.clear()

        for i, piece in enumerate(pieces):
            prev = messages[i - 1] if i > 0 else None
            if prev is not None:
                closing = ""
                if prev.role == "assistant" and piece.startswith(self.end_of_turn):
                    piece = piece[len(self.end_of_turn):]
                    sampled_eot = bool(prev.sampled_ids) and prev.sampled_ids[-1] == self.end_of_turn_id
                    if not sampled_eot:  # truncated sample or re-tokenised text: the template closes the turn
                        run.append((self.end_of_turn, Kind.END_OF_TURN, i - 1))
                elif piece.startswith(self.end_of_turn):
                    closing, piece = self.end_of_turn, piece[len(self.end_of_turn):]
                stripped = piece.lstrip()
                closing += piece[:len(piece) - len(stripped)]
                if closing:
                    run.append((closing, Kind.TEMPLATE, i - 1))
                piece = stripped
            if piece:  # header of message i (or, after the last message, of the generation prompt)
                run.append((piece, Kind.TEMPLATE, i))
            if i == len(messages):
                break
            m = messages[i]
            if m.role == "assistant" and m.sampled_ids is not None:
                if m.prefix:
                    run.append((m.prefix, Kind.PREFIX, i))
                flush()
                out.extend(m.sampled_ids, [Kind.SAMPLED] * len(m.sampled_ids), [i] * len(m.sampled_ids))
            elif m.text:
                kind = {"system": Kind.SYSTEM, "user": Kind.USER, "assistant": Kind.ASSISTANT}[m.role]
                run.append((m.text, kind, i))
        if add_generation_prompt and generation_prefix:
            run.append((generation_prefix, Kind.PREFIX, len(messages)))
        flush()
        return out

    def _tokenize_run(self, run: list[tuple[str, int, int]], out: Rendered) -> None:
        text = "".join(t for t, _, _ in run)
        char_kind: list[int] = []
        char_owner: list[int] = []
        for t, k, o in run:
            char_kind.extend([k] * len(t))
            char_owner.extend([o] * len(t))
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        kinds, owners = [], []
        for start, end in enc["offset_mapping"]:
            pos = min(start if end > start else max(start - 1, 0), len(text) - 1)
            kinds.append(char_kind[pos])
            owners.append(char_owner[pos])
        out.extend(ids, kinds, owners)
