"""Which task a row belongs to, and the ids of rollouts: defined here once for every command.

Two task identities, for two different jobs:

- `task_key(row)` names a task *definition*: a hash of its source, problem id, type, prompt and
  verification info. `genesys generate` (and the trainer) names each rollout `<task key>-<sample>`
  (`response_id`), so a rerun finds the (task, sample) pairs an output already holds. Every output
  ever written depends on these bytes: the hash must never change.
- `group_key(row)` (and `group_key_columns` for polars frames) says which rollouts are *rated
  together*: the documented rule of `genesys filter` and of the online group filter, "a task is its
  `problem_id`, or its prompt when `problem_id` is missing". It is looser than `task_key` on
  purpose: rollouts of one task written by different runs or tools still form one group, even when
  their `verification_info` was stored differently (an object in jsonl, a JSON string in parquet)
  or a source label differs, and a problem id names a task whatever else changed.

`derive_response_id(row)` is the id `genesys verify` gives a rollout that arrived without one,
from its task and completion, so a rerun recognises the rows it already verified;
`with_unique_response_ids` gives every row of a run such an id, and tells repeated ones apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from genesys.errors import InputError

if TYPE_CHECKING:
    import polars as pl

GroupKey = tuple[str | None, str | None]

_TASK_KEY_FIELDS = ("source", "problem_id", "task_type", "prompt")
_DERIVED_ID_FIELDS = ("problem_id", "task_type", "prompt", "llm_response")


def task_key(row: dict[str, Any]) -> str:
    """A stable id of a task from what defines it: source, problem id, type, prompt, verification info.

    `verification_info` must be a dict here (as `Task.from_row` gives it), not its JSON text.
    """
    identity: list[Any] = [None if row.get(name) is None else str(row[name]) for name in _TASK_KEY_FIELDS]
    identity.append(row.get("verification_info") or {})
    encoded = orjson.dumps(identity, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.blake2b(encoded, digest_size=10).hexdigest()


def response_id(key: str, sample: int) -> str:
    """The id of sample `sample` of the task with key `key`."""
    return f"{key}-{sample}"


def request_seed(seed: int, key: str) -> int:
    """The sampling seed of the task with key `key` in a run of seed `seed`: a task samples the same way
    whatever else is in the run, and a validator told the run seed derives it again."""
    return int.from_bytes(hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=4).digest(), "big")


def derive_response_id(row: dict[str, Any]) -> str:
    """A stable id for a rollout row that has no `response_id`, from its task and completion."""
    hasher = hashlib.blake2b(digest_size=12)
    for name in _DERIVED_ID_FIELDS:
        value = row.get(name)
        hasher.update(b"\x00" if value is None else str(value).encode("utf-8", "surrogatepass"))
        hasher.update(b"\x1f")
    return "derived-" + hasher.hexdigest()


def with_unique_response_ids(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """`rows`, each with a unique `response_id`: derived when missing, suffixed `#n` when repeated."""
    seen: set[str] = set()
    for row in rows:
        key = row.get("response_id")
        key = derive_response_id(row) if key is None or key == "" else str(key)
        base, n = key, 0
        while key in seen:
            n += 1
            key = f"{base}#{n}"
        seen.add(key)
        row["response_id"] = key
        yield row


def group_key(row: dict[str, Any]) -> GroupKey:
    """The task a rollout is rated with: `(problem_id, None)`, or `(None, prompt)` without a problem id."""
    problem_id = row.get("problem_id")
    if problem_id is not None:
        return str(problem_id), None
    prompt = row.get("prompt")
    if prompt is None:
        raise InputError(
            "a rollout has neither 'problem_id' nor 'prompt': cannot tell which task it belongs to"
        )
    return None, str(prompt)


def group_key_columns(columns: Collection[str]) -> list[pl.Expr]:
    """`group_key` as two polars expressions over a frame with `columns`, to group or select by.

    A row with neither value gets (null, null); a frame lacking both columns is an InputError.
    """
    import polars as pl

    if "problem_id" not in columns and "prompt" not in columns:
        raise InputError(
            "the rollouts have neither 'problem_id' nor 'prompt': cannot tell which task a rollout belongs to"
        )
    problem_id = (
        pl.col("problem_id").cast(pl.String) if "problem_id" in columns else pl.lit(None, dtype=pl.String)
    )
    prompt = pl.col("prompt").cast(pl.String) if "prompt" in columns else pl.lit(None, dtype=pl.String)
    return [
        problem_id.alias("__genesys_problem_id"),
        pl.when(problem_id.is_null()).then(prompt).alias("__genesys_prompt"),
    ]
