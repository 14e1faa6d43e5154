"""Sample trajectories of a rollouts table as one self-contained HTML page: what the model was shown, what it
thought and did, and what each turn earned. Inline CSS only (no scripts, no links), every value HTML-escaped:
model output is untrusted text and the page must open offline, e.g. as an MLflow artifact."""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ragen.agent.chat import Kind
from ragen.agent.parsing import parse_response

if TYPE_CHECKING:
    import pandas as pd

Decode = Callable[[Sequence[int]], str]  # token ids -> text, e.g. ChatRenderer.decode

_ASSISTANT = {int(k) for k in (Kind.PREFIX, Kind.SAMPLED, Kind.ASSISTANT, Kind.END_OF_TURN)}
_STATE = re.compile(r"State:\n(.*?)\nYou have -?\d+ actions left", re.DOTALL)  # prompts.state_block
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_NO_TEXT = ("The rollouts table stores token ids, not text: pass decode= (the tokenizer's decode) to show each "
            "turn's state and the model's response.")

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:70em}
h1{font-size:1.4em} h2{font-size:1.1em;margin:0 0 .3em}
table.summary{border-collapse:collapse} table.summary td,table.summary th{border:1px solid #ccc;padding:.2em .6em}
section.traj{border:1px solid #bbb;border-radius:6px;padding:.8em;margin:1.2em 0}
.meta{margin:.2em 0 .6em;color:#444} .badge{border-radius:4px;padding:0 .4em;margin-left:.3em;font-size:.85em}
.best{background:#d4f4d4} .worst{background:#f8d4d4} .flag{background:#eee}
div.turn{border-left:4px solid #8ab;padding:.3em .8em;margin:.6em 0} div.turn.error{border-left-color:#d66}
.turn-head{font-weight:600} .label{font-size:.85em;color:#666;margin-top:.4em}
pre{background:#f6f6f6;padding:.4em;margin:.1em 0;white-space:pre-wrap;overflow-wrap:anywhere}
pre.state{font-family:ui-monospace,monospace;line-height:1.15} code{background:#eef;padding:0 .3em}
.bad{color:#b00} .note{color:#666;font-style:italic}
"""


def render_trajectories_html(rollouts: pd.DataFrame, n: int = 8, title: str = "Sample trajectories", *,
                             decode: Decode | None = None) -> str:
    """Up to ``n`` trajectories of ``rollouts`` (see ``select_trajectories``) as an HTML page. Per-turn state
    and response text are recovered from ``input_ids`` only when ``decode`` is given."""
    rows = rollouts.to_dict("records")
    chosen = select_trajectories(rows, n) if rows else []
    scored = [i for i in range(len(rows)) if math.isfinite(_float(rows[i].get("score")))]
    marks: dict[int, str] = {}
    if scored:  # a table of equal scores has a best and no distinct worst
        marks[_worst(rows, scored)] = "worst"
        marks[_best(rows, scored)] = "best"
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_esc(title)}</title>",
             f"<style>{_CSS}</style></head><body>\n<h1>{_esc(title)}</h1>",
             f"<p>Showing {len(chosen)} of {len(rows)} trajectories.</p>", _summary(rows)]
    if decode is None:
        parts.append(f"<p class=\"note\">{_esc(_NO_TEXT)}</p>")
    parts += [_trajectory(i, rows[i], marks.get(i), decode) for i in chosen]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def select_trajectories(rows: Sequence[Mapping[str, Any]], n: int) -> list[int]:
    """Row indices (ascending) of up to ``n`` trajectories: the best and the worst score first, then round-robin
    over groups, a group already shown waiting its turn, so the sample spreads over tasks. Ties go to table
    order, so the same table always gives the same sample."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    scored = [i for i in range(len(rows)) if math.isfinite(_float(rows[i].get("score")))]
    picked = list(dict.fromkeys([_best(rows, scored), _worst(rows, scored)])) if scored else []
    groups = [(r.get("iteration"), r.get("mode"), r.get("group")) for r in rows]
    first_seen = {g: k for k, g in enumerate(dict.fromkeys(groups))}
    taken = Counter(groups[i] for i in picked)
    rest, first = [], set(picked)
    for i, g in enumerate(groups):
        if i not in first:
            rest.append((taken[g], first_seen[g], i))
            taken[g] += 1
    picked += [i for _, _, i in sorted(rest)]
    return sorted(picked[:n])


def turn_texts(input_ids: Sequence[int], kinds: Sequence[int], decode: Decode) -> list[tuple[str, str]]:
    """(prompt, response) text of each assistant turn in a stored sequence; a turn's prompt is the user message
    right before it. The sequence holds only the turns inside the context window, i.e. the last ones."""
    runs: list[tuple[str, list[int]]] = []  # maximal runs of user / assistant / other tokens
    for tid, k in zip(input_ids, kinds, strict=True):
        cls = "assistant" if int(k) in _ASSISTANT else "user" if int(k) == Kind.USER else ""
        if runs and runs[-1][0] == cls:
            runs[-1][1].append(int(tid))
        else:
            runs.append((cls, [int(tid)]))
    out, prompt = [], ""
    for cls, ids in runs:
        if cls == "user":
            prompt = decode(ids)
        elif cls == "assistant":
            out.append((prompt, decode(ids)))
            prompt = ""
    return out


def _trajectory(index: int, row: Mapping[str, Any], mark: str | None, decode: Decode | None) -> str:
    head = " · ".join(f"{k} {_esc(row.get(k))}" for k in ("env_id", "group", "member", "seed", "iteration")
                      if k in row)
    badges = f"<span class=\"badge {mark}\">{mark} score</span>" if mark else ""
    badges += "".join(f"<span class=\"badge flag\">{f.replace('_', ' ')}</span>"
                      for f in ("truncated", "context_exhausted") if _truthy(row.get(f)))
    meta = (f"score <b>{_fmt(row.get('score'))}</b> · success {_yes(row.get('success'))} · "
            f"turns {_esc(row.get('num_turns'))} · actions {_esc(row.get('num_actions'))} · "
            f"format errors {_esc(row.get('num_format_errors'))} · format penalty {_fmt(row.get('format_penalty'))}")
    rewards = _list(row.get("turn_rewards"))
    texts = turn_texts(_list(row.get("input_ids")), _list(row.get("kinds")), decode) if decode else []
    offset = len(rewards) - len(texts)  # turns that fell out of the context window have no text
    turns = [_turn(t, row, texts[t - offset] if 0 <= t - offset < len(texts) else None, decode is not None)
             for t in range(len(rewards))]
    return (f"<section class=\"traj\" id=\"traj-{index}\">\n<h2>{_esc(row.get('tag'))} · {_esc(row.get('mode'))}"
            f" · {head}{badges}</h2>\n<p class=\"meta\">{meta}</p>\n" + "\n".join(turns) + "\n</section>")


def _turn(t: int, row: Mapping[str, Any], text: tuple[str, str] | None, decode_given: bool) -> str:
    def at(col: str) -> Any:
        vals = _list(row.get(col))
        return vals[t] if t < len(vals) else None

    error = _truthy(at("turn_format_error"))
    head = (f"Turn {t + 1} · reward <b>{_fmt(at('turn_rewards'))}</b> · valid {_yes(at('turn_valid'))} · "
            f"effective {_yes(at('turn_effective'))}" + (" · <span class=\"bad\">format error</span>" if error else "")
            + f" · finish {_esc(at('turn_finish_reasons') or '?')}")
    body = []
    if text is not None:
        prompt, response = text
        state = _STATE.findall(prompt)
        body.append(f"<div class=\"label\">State shown</div><pre class=\"state\">{_esc(state[-1])}</pre>" if state
                    else f"<div class=\"label\">Prompt</div><pre class=\"state\">{_esc(prompt)}</pre>")
        parsed = parse_response(response, max_actions=10**6)
        if not parsed.matched:  # the run may have had think off: an answer alone still names the actions
            parsed = parse_response(response, enable_think=False, max_actions=10**6)
        if parsed.think:
            body.append(f"<div class=\"label\">Think</div><pre class=\"think\">{_esc(parsed.think)}</pre>")
        body.append(f"<div class=\"label\">Parsed actions</div>{_actions(parsed.actions)}" if parsed.matched
                    else "<div class=\"label\">Parsed actions</div><span class=\"bad\">no answer found</span>")
    elif decode_given:
        body.append("<p class=\"note\">Before the context window: not in the stored sequence.</p>")
    executed = [str(a) for a in _list(at("turn_actions"))]
    body.append(f"<div class=\"label\">Executed actions</div>{_actions(executed)}")
    if text is not None:
        body.append(f"<details><summary>Raw response</summary><pre>{_esc(text[1])}</pre></details>")
    return f"<div class=\"turn{' error' if error else ''}\"><div class=\"turn-head\">{head}</div>{''.join(body)}</div>"


def _summary(rows: Sequence[Mapping[str, Any]]) -> str:
    by_tag: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_tag.setdefault(str(r.get("tag")), []).append(r)
    lines = ["<table class=\"summary\"><tr><th>tag</th><th>trajectories</th><th>mean score</th><th>success</th></tr>"]
    for tag, sub in sorted(by_tag.items()):
        scores = [s for s in (_float(r.get("score")) for r in sub) if math.isfinite(s)]
        mean = sum(scores) / len(scores) if scores else math.nan
        success = sum(_truthy(r.get("success")) for r in sub) / len(sub)
        lines.append(f"<tr><td>{_esc(tag)}</td><td>{len(sub)}</td><td>{_fmt(mean)}</td><td>{success:.0%}</td></tr>")
    return "\n".join([*lines, "</table>"])


def _best(rows: Sequence[Mapping[str, Any]], scored: Sequence[int]) -> int:
    return max(scored, key=lambda i: (_float(rows[i].get("score")), -i))


def _worst(rows: Sequence[Mapping[str, Any]], scored: Sequence[int]) -> int:
    return min(scored, key=lambda i: (_float(rows[i].get("score")), i))


def _actions(actions: Sequence[str]) -> str:
    return " ".join(f"<code>{_esc(a)}</code>" for a in actions) if actions else "<span class=\"note\">none</span>"


def _esc(value: Any) -> str:
    """HTML-escaped text. Control characters become U+FFFD and lone surrogates '?': raw model output may hold
    either, and the page must stay valid HTML that encodes as UTF-8."""
    text = _CONTROL.sub("\ufffd", str(value)).encode("utf-8", "replace").decode("utf-8")
    return html.escape(text, quote=True)


def _list(value: Any) -> list[Any]:
    """A stored list column as a list (parquet gives numpy arrays; a missing column gives None)."""
    try:
        return list(value)
    except TypeError:
        return []


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _truthy(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


def _yes(value: Any) -> str:
    return "?" if value is None else "yes" if _truthy(value) else "no"


def _fmt(value: Any) -> str:
    x = _float(value)
    return "?" if math.isnan(x) else f"{x:.4g}"
