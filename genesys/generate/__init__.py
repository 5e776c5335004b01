"""Rollout generation: tasks in, rollouts with token ids and logprobs out.

`run_generation` (in `genesys.generate.runner`) drives a backend found through the `genesys_backends`
hook (`backend.py` holds the interface and picks a backend by name). Built in (`builtin.py`): `vllm` (offline
engine on GPU), `transformers` (`hf.py`, CPU or GPU) and `openai` (any OpenAI-compatible server),
all producing the same rollout columns, which `rows.py` builds (requests, seeds, `RowBuilder`; the
trainer's online rollouts use it too).
"""
