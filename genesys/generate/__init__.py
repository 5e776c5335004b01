"""Rollout generation: tasks in, rollouts with token ids and logprobs out.

`run_generation` (in `genesys.generate.runner`) drives one of the backends: `vllm` (offline engine
on GPU), `transformers` (`hf.py`, CPU or GPU) or `openai` (any OpenAI-compatible server), all
producing the same rollout columns.
"""
