"""Prompt text (docs/environments.md, agent I/O): the first user message, the per-turn block, reward messages,
forced prefix."""

from __future__ import annotations

from ragen.envs.registry import TagSpec

SYSTEM_PROMPT = "You're a helpful assistant. "
THINK_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
ANSWER_FORMAT = "<answer> [your answer] </answer>"


def forced_prefix(enable_think: bool) -> str:
    """Generation continues after this text; it is re-attached before parsing."""
    return "<think>" if enable_think else "<answer>"


def first_user_message(spec: TagSpec, action_sep: str = "||") -> str:
    """Instruction, then the symbol glossary and the action list where the tag shows them."""
    text = spec.instruction
    vocab = spec.shown_grid_vocab
    if vocab:
        text += "\nThe meaning of each symbol in the state is:\n" + ", ".join(f"{k}: {v}" for k, v in vocab.items())
    if spec.prompt_actions:
        text += "\nYour available actions are:\n" + ", ".join(spec.prompt_actions)
        text += (f"\nYou can make up to {spec.max_actions_per_traj} actions, separated by the action separator "
                 f'" {action_sep} "\n')
    return text


def turn_header(turn: int) -> str:
    return f"\nTurn {turn}:\n"


def state_block(state: str, actions_left: int, max_tokens: int, enable_think: bool) -> str:
    fmt = THINK_FORMAT if enable_think else ANSWER_FORMAT
    return (f"State:\n{state}\nYou have {actions_left} actions left. Always output: {fmt} with no extra text. "
            f"Strictly follow this format. Max response length: {max_tokens} words (tokens).\n")


def reward_message(reward: float | int) -> str:
    """Python's default formatting of the summed turn reward, as the original prints it
    (``-0.30000000000000004`` after three steps, ``0`` when nothing was executed)."""
    return f"Reward:\n{reward}\n"
