"""Options every task here shares: its inputs are paths and small records, so Prefect caches nothing and keeps no
result (the files on disk are the result)."""

from prefect.cache_policies import NO_CACHE

NO_RESULT = {"cache_policy": NO_CACHE, "persist_result": False}
