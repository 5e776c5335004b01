"""Attestations: a row's content signed by the trusted side, so a later command can tell that it is
what `genesys validate` (and then `genesys verify`) wrote, unchanged.

The trust key is a secret file only the trusted side holds (`TrustKey`). `genesys validate` writes
each row with an `attestation`: an HMAC-SHA256 under that key over a canonical encoding of every
column the row's use depends on (`ATTESTED_COLUMNS`: the task, the prompt and completion tokens and
text, the logprobs, the sampling settings, the proof verdict and the score and reward; for a
trajectory also its messages, turns, error and completion mask, `TRAJECTORY_ATTESTED`). `genesys
verify` checks it before scoring and signs the scored row again; `--require-proofs` (filter, train)
counts a row only when its attestation checks out under the same key. A worker never sees the key,
so it can neither make an attestation nor change an attested row.

The encoding does not depend on the file format: dict columns stored as JSON text (parquet) are
read back as dicts, text columns as text, scores, rewards and logprobs as floats, and a missing
column is the same as null.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from genesys.errors import InputError
from genesys.schema import (
    JSON_COLUMNS,
    RESPONSE_COLUMNS,
    TASK_COLUMNS,
    TRAJECTORY_COLUMNS,
    VERDICT_COLUMNS,
    SchemaError,
    parse_json_field,
)

ATTESTATION_COLUMN = "attestation"
# Columns `genesys validate` adds that consumers act on: the proof verdict, whether the task came from
# the trusted task set, whether the sampling was proven.
VALIDATION_COLUMNS = ("toploc_valid", "toploc_problems", "trusted_task", "sampling_proven")
ATTESTED_COLUMNS = (*TASK_COLUMNS, *RESPONSE_COLUMNS, "target_length", *VALIDATION_COLUMNS, *VERDICT_COLUMNS)
TRAJECTORY_ATTESTED = (*TRAJECTORY_COLUMNS, "completion_mask")
_TEXT_COLUMNS = frozenset(
    (*TASK_COLUMNS, "llm_response", "response_id", "model_name", "finish_reason")
) - frozenset(JSON_COLUMNS)
_FLOAT_COLUMNS = frozenset(("score", "reward"))
_VERSION = "v1"
KEY_ENV = "GENESYS_TRUST_KEY"
KEY_BYTES = 32


def default_key_path() -> Path:
    """Where the trust key is when no `--trust-key` names it: `$GENESYS_TRUST_KEY`, else
    `$XDG_CONFIG_HOME/genesys/trust.key` (`~/.config/genesys/trust.key`)."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config_home) / "genesys" / "trust.key"


class TrustKey:
    """The trusted side's secret: signs rows and checks their attestations."""

    def __init__(self, secret: bytes, path: Path) -> None:
        if len(secret) < KEY_BYTES:
            raise InputError(f"trust key {path}: {len(secret)} bytes; a key has at least {KEY_BYTES}")
        self._secret = secret
        self.path = path
        self.created = False  # whether `load` made the key file just now
        self.key_id = hashlib.sha256(b"genesys trust key id\x00" + secret).hexdigest()[:12]

    @classmethod
    def load(cls, path: str | Path | None, *, create: bool = False, flag: str = "--trust-key") -> TrustKey:
        """The key in `path` (default: `default_key_path()`). With `create`, a missing key file is
        made (32 random bytes, hex, readable by its owner only). A key file others may read is refused."""
        path = Path(path).expanduser() if path else default_key_path()
        if not path.exists():
            if not create:
                raise InputError(
                    f"no trust key at {path}: `genesys validate` creates one there when it signs rows; "
                    f"give the key validate used with {flag} FILE"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another run made it meanwhile: use theirs
                return cls.load(path, flag=flag)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(KEY_BYTES) + "\n")
            key = cls.load(path, flag=flag)
            key.created = True
            return key
        mode = path.stat().st_mode
        if mode & 0o077:
            raise InputError(
                f"trust key {path} may be read by other users (mode {mode & 0o777:o}): chmod 600 {path}"
            )
        text = path.read_text().strip()
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise InputError(f"trust key {path}: expected hexadecimal text") from None
        return cls(secret, path)

    def sign(self, row: Mapping[str, Any]) -> str:
        """The attestation of `row` as it is now."""
        mac = hmac.new(self._secret, canonical_bytes(row), hashlib.sha256).hexdigest()
        return f"{_VERSION}:{self.key_id}:{mac}"

    def problem(self, row: Mapping[str, Any]) -> str | None:
        """Why `row`'s attestation does not vouch for it (missing, of another key, or the row changed
        since it was signed), or None when it does."""
        attestation = row.get(ATTESTATION_COLUMN)
        if not attestation:
            return "it has no attestation (rows count only as genesys validate --tasks wrote them)"
        parts = str(attestation).split(":")
        if len(parts) != 3 or parts[0] != _VERSION:
            return f"its attestation is not one genesys writes ({_VERSION}:KEY:MAC)"
        if parts[1] != self.key_id:
            return f"it was attested under another trust key (key id {parts[1]}, this key's {self.key_id})"
        if not hmac.compare_digest(self.sign(row), str(attestation)):
            return "its attestation does not match it: the row changed after it was attested"
        return None


def canonical_bytes(row: Mapping[str, Any]) -> bytes:
    """The attested columns of `row`, encoded the same whatever file format carried them."""
    fields = {name: canonical_value(name, row.get(name)) for name in ATTESTED_COLUMNS}
    # A trajectory's conversation and mask (what its score and its loss depend on); a row without
    # them is attested as before they existed.
    fields |= {
        name: canonical_value(name, row[name]) for name in TRAJECTORY_ATTESTED if row.get(name) is not None
    }
    return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def canonical_value(name: str, value: Any) -> Any:
    """One column's value as attested: JSON text as a dict, text as text, scores and logprobs as floats."""
    if name == "messages":  # a list of dicts, or its JSON text
        try:
            return orjson.loads(value) if isinstance(value, (str, bytes)) else value
        except orjson.JSONDecodeError:
            return ["unparsed", str(value)]
    if name in JSON_COLUMNS:
        try:
            return parse_json_field(value, name)
        except SchemaError:
            return ["unparsed", str(value)]
    if value is None:
        return None
    if name in _TEXT_COLUMNS:
        return str(value)
    if name in _FLOAT_COLUMNS:
        return _float(value)
    if name == "completion_logprobs" and isinstance(value, (list, tuple)):
        return value if all(type(item) is float for item in value) else [_float(item) for item in value]
    return value


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
