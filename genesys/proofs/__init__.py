"""Trustless rollouts: TOPLOC proofs written at generation and checked by `genesys validate`.

- `toploc`: building and verifying proofs over last-layer hidden states, guarded against the
  ways the `toploc` package fails silently or kills the process.
- `capture`: the final hidden states of a transformers model, recorded with a forward hook.
- `weights`: the hash of a model's weights that rows carry.
- `checks`: what else a row must satisfy (its ids decode to its text, its logprobs are the model's,
  its model and sampling settings are the expected ones, it stops where the rules say).
- `validate`: the file run behind `genesys validate`.
"""
