"""One trajectory of the multi-turn loop: prompts as token ids, parsing, env steps, and the final assembly into
one token sequence with loss mask, rewards and sampling logprobs (docs/environments.md, docs/design.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragen.agent.chat import ChatRenderer, Kind, Message
from ragen.agent.parsing import (
    NO_CLAIM,
    MappedActions,
    ParsedResponse,
    check_position_claim,
    map_actions,
    parse_response,
)
from ragen.agent.prompts import first_user_message, forced_prefix, reward_message, state_block, turn_header
from ragen.agent.turns import TurnOutcome, execute_turn
from ragen.config import AgentConfig
from ragen.envs.base import TextEnv
from ragen.envs.registry import TagSpec


@dataclass
class Entry:
    """One history entry: the state shown, then (once answered) the response and its outcome."""

    state: str
    actions_left: int
    response_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    text: str = ""  # decoded response with the forced prefix re-attached
    parsed: ParsedResponse | None = None
    mapped: MappedActions | None = None
    outcome: TurnOutcome | None = None
    finish_reason: str = ""  # the engine's: "stop" (end-of-turn sampled) or "length"
    position_match: int = NO_CLAIM  # the think's stated position against the agent's (parsing.check_position_claim)

    @property
    def answered(self) -> bool:
        return self.outcome is not None


@dataclass
class Trajectory:
    """A finished episode as training data. Per-token arrays have the length of ``input_ids``:
    ``loss_mask[i]`` says token i is trained; ``rewards[i]`` is credited to the action that produced token i;
    ``sampled_logprobs[i]`` is the engine's logprob for sampled tokens, NaN elsewhere."""

    input_ids: list[int]
    loss_mask: list[bool]
    rewards: list[float]
    sampled_logprobs: list[float]
    kinds: list[int]
    turn_end_positions: list[int]
    turn_rewards: list[float]
    score: float  # sum of turn rewards + accumulated format penalty
    format_penalty: float
    num_format_errors: int
    success: bool
    terminated: bool
    truncated: bool
    num_turns: int
    num_actions: int
    action_is_valid: float
    action_is_effective: float
    response_length: int  # assistant tokens in the sequence (the paper's "response length")
    actions: list[list[str]] = field(default_factory=list)
    turn_valid: list[bool] = field(default_factory=list)  # the turn's last action was valid
    turn_effective: list[bool] = field(default_factory=list)  # ... and changed the state
    turn_format_error: list[bool] = field(default_factory=list)
    turn_finish_reasons: list[str] = field(default_factory=list)
    turn_position_match: list[int] = field(default_factory=list)  # NO_CLAIM / WRONG_CLAIM / RIGHT_CLAIM per turn
    context_exhausted: bool = False  # stopped because the next prompt no longer fit max_model_len


class Episode:
    def __init__(self, env: TextEnv, spec: TagSpec, agent: AgentConfig, renderer: ChatRenderer, *, seed: int,
                 stream: int | None = None, reset_options: dict | None = None) -> None:
        self.env, self.spec, self.agent, self.renderer = env, spec, agent, renderer
        state, _ = env.reset(seed=seed, options={**(reset_options or {}), "member": stream})
        self.history: list[Entry] = [Entry(state, spec.max_actions_per_traj)]
        self.prefix = forced_prefix(agent.enable_think)
        self.first_user = first_user_message(spec, agent.action_sep)
        self.penalty = 0.0
        self.num_format_errors = 0
        self.num_actions = 0
        self.terminated = self.truncated = False
        self.context_exhausted = False
        self.done = False

    # -- rendering -----------------------------------------------------------------------------------------
    def _messages(self, entries: Sequence[Entry], for_update: bool) -> list[Message]:
        msgs = [Message("system", self.agent.system_prompt)]
        pending = self.first_user
        for idx, e in enumerate(entries):
            pending += turn_header(idx + 1)
            pending += state_block(e.state, e.actions_left, self.spec.max_tokens, self.agent.enable_think)
            if not e.answered:
                continue
            msgs.append(Message("user", pending))
            assert e.parsed is not None and e.outcome is not None
            if self.agent.response_storage == "sampled":
                msgs.append(Message("assistant", sampled_ids=e.response_ids, prefix=self.prefix))
            else:
                msgs.append(Message("assistant", e.parsed.rebuilt))
            pending = reward_message(e.outcome.reward)
            if for_update and idx == len(entries) - 1:
                pending = ""
        if pending:
            msgs.append(Message("user", pending))
        return msgs

    def _window(self, entries: list[Entry]) -> list[Entry]:
        k = self.agent.max_context_window
        return entries if k < 0 else entries[-k:]

    def prompt_ids(self) -> list[int]:
        """Token ids the engine continues from: the conversation, the assistant header and the forced prefix."""
        if self.done:
            raise RuntimeError("episode is finished")
        msgs = self._messages(self._window(self.history), for_update=False)
        return self.renderer.render(msgs, add_generation_prompt=True, generation_prefix=self.prefix).ids

    # -- stepping ------------------------------------------------------------------------------------------
    def stop_for_context(self) -> None:
        """End the episode, truncated, because its next prompt leaves no room to generate under the context cap."""
        if not any(e.answered for e in self.history):
            raise ValueError("the first prompt leaves no room to generate; raise rollout.max_model_len")
        self.done = self.terminated = self.truncated = self.context_exhausted = True

    def record(self, response_ids: Sequence[int], logprobs: Sequence[float] | None = None,
               finish_reason: str = "") -> Entry:
        """Take the engine's sampled ids for the current turn: parse, penalise, execute, advance."""
        if self.done:
            raise RuntimeError("episode is finished")
        if not response_ids:
            raise ValueError("the engine returned no tokens for this turn; generation must yield at least one")
        if logprobs is not None and len(logprobs) != len(response_ids):
            raise ValueError(f"got {len(logprobs)} logprobs for {len(response_ids)} sampled tokens")
        entry = self.history[-1]
        entry.response_ids = tuple(int(t) for t in response_ids)
        entry.logprobs = None if logprobs is None else tuple(float(x) for x in logprobs)
        entry.finish_reason = finish_reason
        entry.text = self.prefix + self.renderer.decode(entry.response_ids)
        entry.parsed = parse_response(entry.text, enable_think=self.agent.enable_think,
                                      max_actions=self.agent.max_actions_per_turn, action_sep=self.agent.action_sep)
        entry.mapped = map_actions(entry.parsed.actions, self.env.action_lookup)
        entry.position_match = check_position_claim(entry.parsed.think, self.env.agent_cell())
        if entry.mapped.format_error:
            self.penalty += self.agent.format_penalty
            self.num_format_errors += 1
        entry.outcome = execute_turn(self.env, entry.mapped.ids, entry.actions_left)
        self.num_actions += len(entry.outcome.executed)
        budget = self.spec.max_actions_per_traj
        if entry.outcome.done:
            self.terminated, self.truncated = True, not entry.outcome.success
        elif self.num_actions >= budget:
            self.terminated = self.truncated = True
        answered = len(self.history)
        self.done = self.terminated or answered >= self.agent.max_turn
        self.history.append(Entry(entry.outcome.state, budget - self.num_actions))
        return entry

    @property
    def success(self) -> bool:
        return self.terminated and not self.truncated

    # -- assembly ------------------------------------------------------------------------------------------
    def assemble(self) -> Trajectory:
        answered = [e for e in self.history if e.answered]
        if not answered:
            raise RuntimeError("nothing to assemble: the episode has no answered turn")
        window = self._window(answered)
        rendered = self.renderer.render(self._messages(window, for_update=True))
        # A turn ends at its last trainable assistant token, so rewards always sit inside the assistant mask
        # (a truncated sample's closing end-of-turn token comes from the template and is not trained).
        assistant_kinds = (Kind.SAMPLED,) if self.agent.response_storage == "sampled" else (
            Kind.ASSISTANT, Kind.END_OF_TURN)
        ends = rendered.assistant_turn_ends(assistant_kinds)
        cut = ends[-1] + 1
        ids, kinds, owners = rendered.ids[:cut], rendered.kinds[:cut], rendered.owners[:cut]
        is_assistant = [k in assistant_kinds for k in kinds]
        mask = is_assistant if self.agent.loss_mask == "assistant" else [o >= 1 for o in owners]
        turn_rewards = [float(e.outcome.reward) for e in answered]  # type: ignore[union-attr]
        score = sum(turn_rewards) + self.penalty
        rewards = [0.0] * len(ids)
        if self.agent.use_turn_scores:  # no penalty in this mode, as in the original
            for pos, e in zip(ends, window, strict=True):
                rewards[pos] = float(e.outcome.reward)  # type: ignore[union-attr]
        else:
            rewards[ends[-1]] = score
        logprobs = [math.nan] * len(ids)
        sampled_positions = [i for i, k in enumerate(kinds) if k == Kind.SAMPLED]
        flat = [lp for e in window for lp in (e.logprobs or [math.nan] * len(e.response_ids or ()))]
        if self.agent.response_storage == "sampled":
            for i, lp in zip(sampled_positions, flat, strict=True):
                logprobs[i] = lp
        n_turns = len(answered)
        infos = [e.outcome.info for e in answered]  # type: ignore[union-attr]
        valid = [bool(i.get("action_is_valid", False)) for i in infos]
        effective = [bool(i.get("action_is_effective", False)) for i in infos]
        return Trajectory(
            input_ids=ids, loss_mask=mask, rewards=rewards, sampled_logprobs=logprobs, kinds=kinds,
            turn_end_positions=ends, turn_rewards=turn_rewards, score=score, format_penalty=self.penalty,
            num_format_errors=self.num_format_errors, success=self.success, terminated=self.terminated,
            truncated=self.truncated, num_turns=n_turns, num_actions=self.num_actions,
            action_is_valid=sum(valid) / n_turns, action_is_effective=sum(effective) / n_turns,
            response_length=sum(is_assistant),
            actions=[[self.env.action_lookup[a] for a in e.outcome.executed] for e in answered],  # type: ignore[union-attr]
            turn_valid=valid, turn_effective=effective,
            turn_format_error=[bool(e.mapped and e.mapped.format_error) for e in answered],
            turn_finish_reasons=[e.finish_reason for e in answered], context_exhausted=self.context_exhausted,
            turn_position_match=[e.position_match for e in answered],
        )
