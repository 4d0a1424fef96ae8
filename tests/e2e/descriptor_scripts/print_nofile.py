"""A worker that prints its soft descriptor limit (inherited from its agent)."""

import resource

print(f"soft nofile {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}", flush=True)
