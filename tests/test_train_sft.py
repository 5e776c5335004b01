"""`genesys sft`: the loss counts completion tokens only, prompts are rendered as generation renders
them, rejection sampling keeps what reaches the threshold, bad keys are named, and a resumed run
reaches the weights of an uninterrupted one."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, read_jsonl, write_jsonl  # noqa: E402

from genesys.config import SftConfig  # noqa: E402
from genesys.errors import InputError  # noqa: E402
from genesys.train.batch import TrainingSequence, collate  # noqa: E402
from genesys.train.loss import reduce_loss  # noqa: E402
from genesys.train.sft import SFTTrainer, sft, sft_token_loss  # noqa: E402
from genesys.train.sources.examples import load_examples, tokenize_example  # noqa: E402


def sft_config(model: str, out: Path, **sections: Any) -> SftConfig:
    data: dict[str, Any] = {
        "model": model,
        "output_dir": str(out),
        "progress": False,
        "data": {"tasks": ["arithmetic:count=64,seed=3"]},
        "sft": {"examples_per_step": 8},
        "optim": {"steps": 6, "lr": 3e-3, "max_grad_norm": 1.0, "micro_batch_size": 3},
        "checkpoint": {"every": 2, "keep": 5},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return SftConfig.load(None, data)


class RepeatModel(torch.nn.Module):
    """Logits that give the current token probability 1/2 of coming next and each of the 3 others 1/6
    (a vocabulary of 4): the loss of each position is known by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 4, bias=False)  # one-hot hidden states in, log 3 for the same token
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(4) * math.log(3.0))

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        hidden = torch.nn.functional.one_hot(input_ids, 4).float()
        return SimpleNamespace(hidden_states=(hidden,), logits=self.head(hidden))


def test_the_loss_counts_completion_tokens_only_prompt_and_padding_masked():
    # Sequence one: prompt 1 2, completion 2 2 3. Sequence two: prompt 1, completion 3; pad id 0.
    one = TrainingSequence([1, 2], [2, 2, 3], [0.0] * 3, 0.0)
    two = TrainingSequence([1], [3], [0.0], 0.0)
    micro = collate([one, two], pad_id=0)
    token_loss = sft_token_loss(RepeatModel(), micro)
    # Completion tokens predicted from the token before them: 2->2, 2->2, 2->3; and 1->3.
    same, other = math.log(2.0), math.log(6.0)
    real = torch.tensor([[same, same, other], [other, 0.0, 0.0]])
    assert torch.allclose(token_loss[micro.completion_mask], real[micro.completion_mask])
    loss = reduce_loss(token_loss, micro.completion_mask, "token", denominator=4.0).detach()
    assert float(loss) == pytest.approx((2 * same + 2 * other) / 4)
    # The prompt's own transition (1->2) and the padded positions would each add log 6 or more.
    assert float(loss) < (2 * same + 3 * other) / 5


def test_the_prompt_is_rendered_as_generation_renders_it_and_the_completion_ends_with_eos(tiny_model):
    from transformers import AutoTokenizer

    from genesys.tasks.prompts import build_messages, render_ids

    config = sft_config(
        tiny_model,
        Path("unused"),
        data={"system_prompt": "Be brief."},
        style={"continuation_prefix": "<think>\n"},
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    (example,), _ = load_examples(
        sft_config(tiny_model, Path("unused"), data={"tasks": ["arithmetic:count=1"]})
    )
    sequence = tokenize_example(example, tokenizer, config)
    messages = build_messages(example.prompt, "Be brief.")
    assert sequence.prompt_ids == render_ids(tokenizer, messages, config.style)
    assert tokenizer.decode(sequence.prompt_ids).endswith("<|im_start|>assistant\n<think>\n")
    assert sequence.completion_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(sequence.completion_ids[:-1]) == example.completion


def _rollout(score: float | None, text: str) -> dict[str, Any]:
    return {"problem_id": "p", "prompt": "Compute 1 + 1.", "llm_response": text, "score": score}


def test_rejection_sampling_keeps_the_rollouts_whose_score_reaches_the_threshold(tiny_model, tmp_path):
    rollouts = write_jsonl(
        tmp_path / "rollouts.jsonl",
        [_rollout(1.0, "right"), _rollout(0.5, "half"), _rollout(0.0, "wrong"), _rollout(None, "failed")],
    )
    data = {"tasks": None, "rollouts": [str(rollouts)]}
    examples, counts = load_examples(sft_config(tiny_model, tmp_path, data=data))
    assert [e.completion for e in examples] == ["right"]
    assert (counts.rollouts_below_threshold, counts.rollouts_unscored) == (2, 1)
    examples, counts = load_examples(sft_config(tiny_model, tmp_path, data={**data, "min_score": 0.5}))
    assert [e.completion for e in examples] == ["right", "half"]
    assert "1 rollouts without a score" in counts.describe()
    with pytest.raises(InputError, match="nothing to learn from"):
        load_examples(
            sft_config(
                tiny_model,
                tmp_path,
                data={
                    **data,
                    "min_score": 1.0,
                    "rollouts": [str(write_jsonl(tmp_path / "bad.jsonl", [_rollout(0.0, "wrong")]))],
                },
            )
        )
    unverified = write_jsonl(tmp_path / "unverified.jsonl", [{"prompt": "p", "llm_response": "x"}])
    with pytest.raises(InputError, match=r"unverified.jsonl:1: rollout has no score"):
        load_examples(sft_config(tiny_model, tmp_path, data={**data, "rollouts": [str(unverified)]}))
    trajectory = {
        **_rollout(1.0, "42"),
        "task_type": "guess_number",
        "messages": [{"role": "user", "content": "p"}],
    }
    played = write_jsonl(tmp_path / "played.jsonl", [_rollout(1.0, "right"), trajectory])
    with pytest.raises(InputError, match=r"played.jsonl:2: the rollout is a trajectory .*'guess_number'"):
        load_examples(sft_config(tiny_model, tmp_path, data={**data, "rollouts": [str(played)]}))


def test_tasks_without_a_worked_solution_are_left_out_and_counted(tiny_model, tmp_path):
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            {"problem_id": "a", "prompt": "Compute 1 + 1.", "gold_standard_solution": "\\boxed{2}"},
            {"problem_id": "b", "prompt": "Compute 2 + 2.", "gold_standard_solution": None},
        ],
    )
    examples, counts = load_examples(sft_config(tiny_model, tmp_path, data={"tasks": [str(tasks)]}))
    assert [e.completion for e in examples] == ["\\boxed{2}"]
    assert counts.tasks_without_solution == 1


def test_a_wrong_config_key_is_refused_by_name(tiny_model, tmp_path):
    toml = tmp_path / "sft.toml"
    toml.write_text(
        f'model = "{tiny_model}"\noutput_dir = "{tmp_path / "run"}"\n[data]\ntasks = ["arithmetic:count=8"]\n'
        "[sft]\nexampels_per_step = 4\n"
    )
    result = subprocess.run([GENESYS, "sft", str(toml)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "unknown key 'sft.exampels_per_step'" in result.stderr
    flag = subprocess.run(
        [GENESYS, "sft", str(toml).replace("sft.toml", "none.toml"), "--optim.lrr", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert flag.returncode == 2 and "--optim.lrr" in flag.stderr
    with pytest.raises(InputError, match="give data.tasks"):
        sft_config(tiny_model, tmp_path, data={"tasks": None})
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_reaches_the_weights_of_an_uninterrupted_one(tiny_model, tmp_path, monkeypatch):
    straight = sft(sft_config(tiny_model, tmp_path / "straight"))
    losses = [m["loss"] for m in straight.metrics]
    assert losses[-1] < losses[0]  # it learns

    original = SFTTrainer.train_step

    def killed_in_step_five(self: SFTTrainer) -> dict[str, Any]:
        if self.step == 4:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(SFTTrainer, "train_step", killed_in_step_five)
    with pytest.raises(KeyboardInterrupt):
        sft(sft_config(tiny_model, tmp_path / "killed"))
    assert (tmp_path / "killed" / "checkpoints" / "step-000004").is_dir()
    monkeypatch.setattr(SFTTrainer, "train_step", original)
    resumed = sft(sft_config(tiny_model, tmp_path / "killed"))

    from safetensors.torch import load_file

    expected = load_file(straight.final_dir / "model.safetensors")
    got = load_file(resumed.final_dir / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    assert [m["loss"] for m in read_jsonl(tmp_path / "killed" / "metrics.jsonl")] == losses
    assert sft(sft_config(tiny_model, tmp_path / "killed")).already_complete
