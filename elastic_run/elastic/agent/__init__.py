"""torch.distributed.elastic.agent, mirrored: the package of ``agent.server``.

Owns nothing itself; ``server/`` re-exports elastic-run's agent (``elastic_run.agent``) under
torch's module names."""
