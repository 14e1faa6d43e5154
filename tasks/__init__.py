"""Prefect tasks: thin wrappers that call ragen/ and pass paths and small records (pipeline issue)."""
