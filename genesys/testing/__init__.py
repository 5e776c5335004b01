"""Helpers for testing and benchmarking genesys and the plugins built on it.

- `genesys.testing.digits`: the digit task, a toy reward (the share of digits in a completion) that a
  tiny random-weight model learns in a few dozen steps, its verifier as a plugin module to name in
  $GENESYS_PLUGINS, and task files for it.
- `genesys.testing.tampering`: rollouts with TOPLOC proofs, honest and tampered as a cheating worker
  would tamper them, and the proof settings and thresholds calibrated on the tiny model.

Why a module of the package and not files under tests/: the test suite, the benchmarks and a plugin's
own tests all use these, and each of them must import them as they are installed, with no path of
their own. A verifier that runs in verification worker processes or Ray actors is loaded there by
module name alone, which only an installed module guarantees. What serves the genesys test suite
alone (verifiers that hang, crash or misbehave on purpose, a generation backend without a model,
command-line plugins) stays under tests/.

Nothing in genesys imports this package. Its modules import only the light core at import time;
torch and transformers are imported by the helpers that need them, when they are called.
"""
