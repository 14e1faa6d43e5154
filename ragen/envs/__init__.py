"""Text environments (gymnasium) and their tags. Importing this package registers the env ids."""

from ragen.envs.registry import BUILTIN_TAGS, TagSpec, get_tag, register_envs, resolve_tags

register_envs()

__all__ = ["BUILTIN_TAGS", "TagSpec", "get_tag", "register_envs", "resolve_tags"]
