"""The sharded model's forward passes, as the trainer runs them, leave the logs clean: FSDP2's warning
about the output being a view (meant for code that changes outputs in place, which genesys never
does) is not printed at every step."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_logprobs_of_a_sharded_model_warn_nothing_about_views(tiny_model):
    from genesys.train.batch import TrainingSequence, collate
    from genesys.train.distributed import close_world, init_world
    from genesys.train.loading import sharded_pretrained
    from genesys.train.logprobs import completion_logprobs
    from genesys.train.parallel import device_mesh

    world = init_world()
    try:
        cpu = torch.device("cpu")
        model = sharded_pretrained(tiny_model, world, device_mesh(world, "fsdp2", cpu), "fp32", cpu)
        micro = collate([TrainingSequence([5, 6, 7], [8, 9], [-1.0, -1.0], 1.0)], pad_id=0)
        with warnings.catch_warnings(record=True) as caught:
            for _ in range(2):
                logprobs, _ = completion_logprobs(model, micro, 1.0)
                logprobs.sum().backward()
        assert logprobs.shape == (1, 2)
        assert not [w for w in caught if "view" in str(w.message)], [str(w.message) for w in caught]
    finally:
        close_world(world)
