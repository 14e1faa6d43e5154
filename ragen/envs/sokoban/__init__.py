from ragen.envs.sokoban.env import SokobanEnv
from ragen.envs.sokoban.generator import GenerationError, generate_room
from ragen.envs.sokoban.room import ACTION_LOOKUP, DEFAULT_GRID_LOOKUP, DEFAULT_GRID_VOCAB, Room, grid_vocab_for
from ragen.envs.sokoban.solver import optimal_length, solve

__all__ = ["ACTION_LOOKUP", "DEFAULT_GRID_LOOKUP", "DEFAULT_GRID_VOCAB", "GenerationError", "Room", "SokobanEnv",
           "generate_room", "grid_vocab_for", "optimal_length", "solve"]
