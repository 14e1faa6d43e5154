"""Agent I/O: prompts, parsing, turn execution and episode assembly. Knows tokens, not engines."""
