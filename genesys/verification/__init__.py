"""Verification: rows in, rows with `score`, `verification_result_info` and `error` out, under hard deadlines.

- `api`: `verify_rollouts` (in memory) and `verify_files` (a resumable file run), and `verification_pool`.
- `pool`: the `VerificationPool` interface; `stats`: per task_type totals and their table.
- `engine`: the pool of worker processes on this machine; `worker`: the worker process; `wire`: the
  messages between them.
- `ray_pool`: the same pool over engine actors that Ray restarts (`genesys.cluster.pool`);
  `task_types`: refusing task types no verifier serves.
- `reward_function`: a TRL-style reward function, the pool and the reward stage behind one call.
"""
