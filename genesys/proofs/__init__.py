"""Trustless rollouts: TOPLOC proofs written at generation and checked by `genesys validate`.

- `toploc`: building and verifying proofs over last-layer hidden states, guarded against the
  ways the `toploc` package fails silently or kills the process.
- `hf_capture`: the final hidden states of a transformers model, recorded with a forward hook.
- `vllm_capture`: the same states taken inside a vLLM engine's worker, as it generates or recomputes.
- `weights`: the hash of a model's weights that rows carry.
- `checks`: what else a row must satisfy (its ids decode to its text, its logprobs are the model's,
  its model and sampling settings are the expected ones, it stops where the rules say).
- `recompute`: the prefill `genesys validate` runs over a row (transformers, or the registered
  `vllm` backend's engine with `vllm_capture`).
- `validate`: the file run behind `genesys validate`.

Generation uses the capture and proof modules; this package names no generation backend.
"""
