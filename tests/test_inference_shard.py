"""Stage-only loading: each stage of a pipeline reads from the checkpoint, and holds, its own layers
(plus the embedding on the first stage, the final norm and output layer on the last) and nothing more,
computes what the unsplit model computes, and the weights hash of the proofs streams the checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from genesys.errors import InputError
from genesys.inference.plan import split_layers
from genesys.inference.stage import StageModel


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory: pytest.TempPathFactory) -> str:
    from genesys.generate.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny4") / "model", layers=4))


@pytest.fixture(scope="module")
def sharded(four_layers: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same model saved as several safetensors shards and an index."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("sharded") / "model"
    AutoModelForCausalLM.from_pretrained(four_layers).save_pretrained(path, max_shard_size="60KB")
    AutoTokenizer.from_pretrained(four_layers).save_pretrained(path)
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 2
    return str(path)


@pytest.fixture(scope="module")
def whole(four_layers: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(four_layers, dtype=torch.float32).eval()


def _share(whole: torch.nn.Module, start: int, end: int, first: bool, last: bool) -> dict[str, int]:
    """The checkpoint tensors (name -> elements) stage [start, end) needs: its layers, the embedding
    when first, the final norm and output layer (tied to the embedding here) when last."""
    share = {}
    for name, parameter in whole.named_parameters():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if (
            (layer and start <= int(layer.group(1)) < end)
            or (name == "model.embed_tokens.weight" and (first or last))
            or (name == "model.norm.weight" and last)
        ):
            share[name] = parameter.numel()
    return share


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_each_stage_reads_and_holds_only_its_share_and_the_shares_cover_the_model(four_layers, whole, stages):
    total = 0
    for index, (start, end) in enumerate(split_layers(4, stages)):
        first, last = index == 0, index == stages - 1
        stage = StageModel(four_layers, (start, end), first, last, device="cpu")
        share = _share(whole, start, end, first, last)
        assert sorted(stage.checkpoint_tensors) == sorted(share), index  # read nothing else
        assert stage.parameter_count() == sum(share.values()), index  # and hold nothing else
        held = [
            t for m in (stage.base, stage.output) if m is not None for t in [*m.parameters(), *m.buffers()]
        ]
        assert not any(t.is_meta for t in held)
        assert len(stage.base.layers) == end - start
        total += stage.parameter_count()
    embedding = whole.model.embed_tokens.weight.numel()
    # Every weight is held by exactly one stage, but the tied output layer also by the last one.
    assert total == sum(p.numel() for p in whole.parameters()) + embedding


def _chain(model: str, ranges: list[tuple[int, int]], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The logits of a prefill run stage after stage in this process."""
    hidden = ids
    for index, layer_range in enumerate(ranges):
        stage = StageModel(model, layer_range, index == 0, index == len(ranges) - 1, device="cpu")
        hidden = stage.forward(0, hidden, mask)
    return stage.output(hidden)


@pytest.mark.parametrize("checkpoint", ["single file", "shards"])
def test_a_split_model_computes_the_unsplit_models_logits(four_layers, sharded, whole, checkpoint):
    ids = torch.tensor([[0, 0, 5, 9, 17], [3, 4, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    model = four_layers if checkpoint == "single file" else sharded
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        expected = whole(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = _chain(model, [(0, 1), (1, 3), (3, 4)], ids, mask)
    assert torch.allclose(got[mask.bool()], expected[mask.bool()], atol=1e-5)
    assert torch.equal(got[mask.bool()].argmax(-1), expected[mask.bool()].argmax(-1))


def test_a_stage_reads_half_precision_checkpoints_in_the_dtype_asked(four_layers, tmp_path: Path):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(four_layers, dtype=torch.bfloat16).save_pretrained(path)
    stage = StageModel(str(path), (2, 4), False, True, device="cpu", dtype="auto")
    assert stage.dtype == torch.bfloat16 and stage.output.weight.dtype == torch.bfloat16
    assert StageModel(str(path), (2, 4), False, True, device="cpu").dtype == torch.float32  # CPU default


def test_a_checkpoint_without_safetensors_is_refused_naming_the_model(four_layers, tmp_path: Path):
    from transformers import AutoConfig

    AutoConfig.from_pretrained(four_layers).save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read: unpickling is never an option")
    with pytest.raises(InputError, match="no model.safetensors"):
        StageModel(str(tmp_path), (0, 2), True, False, device="cpu")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_streamed_weights_hash_is_the_loaded_models(four_layers, sharded, dtype):
    from transformers import AutoModelForCausalLM

    from genesys.proofs.weights import checkpoint_weights_sha256, weights_sha256

    loaded = weights_sha256(AutoModelForCausalLM.from_pretrained(four_layers, dtype=dtype))
    assert checkpoint_weights_sha256(four_layers, dtype) == loaded
    assert checkpoint_weights_sha256(sharded, getattr(torch, dtype)) == loaded


def test_a_layer_the_checkpoint_lacks_is_an_error_naming_the_tensor(four_layers, tmp_path: Path):
    import json
    import shutil

    shutil.copytree(four_layers, tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    config["num_hidden_layers"], config["layer_types"] = 5, ["full_attention"] * 5  # one more than saved
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    StageModel(str(tmp_path / "model"), (0, 2), True, False, device="cpu")  # its layers are there
    with pytest.raises(
        InputError, match=r"no tensor 'model\.layers\.4\..*' \(needed by the stage of layers 3\.\.4\)"
    ):
        StageModel(str(tmp_path / "model"), (3, 5), False, True, device="cpu")
