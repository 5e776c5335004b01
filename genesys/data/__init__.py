"""Task and rollout files: what an input argument names, reading and writing rows, whole-file frames, identities.

- `inputs`: resolving input arguments (files, shard directories, saved datasets, globs) into files.
- `io`: reading rows with their `file:line`; `RolloutWriter` (atomic units, resume) and `BufferedWriter`.
- `frames`: rollout files as one polars LazyFrame, for whole-dataset work.
- `identity`: task keys, response ids, and which rollouts are rated together.
- `runs`: `FileRun`, the one resumable file run (overlap check, lock, rejects, resume, flush policy).
"""
