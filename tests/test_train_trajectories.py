"""Training on multi-turn trajectories: the loss is taken over the model's tokens only (the environment's
and tools' tokens are context, never targets), online (environments played by the trainer's backend)
and offline (trajectory files), starting on-policy; a toy two-turn task is learnt, and not without a
learning rate."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import GENESYS, grpo_config, read_jsonl, write_jsonl  # noqa: E402

from genesys.errors import InputError  # noqa: E402
from genesys.testing.digits import TURNS_TASK_TYPE, digit_tasks  # noqa: E402
from genesys.train import train  # noqa: E402
from genesys.train.batch import TrainingSequence, collate, pack  # noqa: E402
from genesys.train.logprobs import completion_logprobs  # noqa: E402
from genesys.train.loss import policy_token_loss, reduce_loss  # noqa: E402
from genesys.train.trainer import Trainer  # noqa: E402

TOLERANCE = 1e-4
config = functools.partial(grpo_config, max_tokens=12)


# --- the micro-batch: targets and mask --------------------------------------------------------------

TRAJECTORY = TrainingSequence(
    [1, 2], [7, 8, 9, 10, 11], [-0.1, 0.0, 0.0, -0.4, -0.5], 1.0, completion_mask=[1, 0, 0, 1, 1]
)
SINGLE = TrainingSequence([4], [12, 13], [-0.2, -0.3], -1.0)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_only_the_model_tokens_are_targets_and_in_the_loss_mask(layout):
    batch = pack([TRAJECTORY, SINGLE]) if layout == "packed" else collate([TRAJECTORY, SINGLE], pad_id=0)
    flat = batch.input_ids.reshape(-1)
    assert flat[batch.targets + 1].tolist() == [7, 10, 11, 12, 13]  # the tokens the targets predict
    assert batch.completion_mask.tolist() == [[1, 0, 0, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.tokens == 5 and TRAJECTORY.model_tokens == 3 and SINGLE.model_tokens == 2
    assert TRAJECTORY.model_positions() == [0, 3, 4]


def test_a_mask_that_does_not_fit_its_completion_is_refused():
    with pytest.raises(ValueError, match="5 completion ids but a mask of 4"):
        replace(TRAJECTORY, completion_mask=[1, 0, 0, 1])


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)


def _sequences(model, scramble: bool) -> list[TrainingSequence]:
    """Two trajectories whose model tokens carry the model's own logprobs (ratio 1); with `scramble`,
    the logprobs recorded at the environment's tokens are nonsense."""
    trajectories = [
        ([5, 6, 7], [30, 31, 40, 41, 42, 32], [1, 1, 0, 0, 0, 1], 1.0),
        ([5, 8], [33, 43, 44, 34, 35, 45], [1, 0, 0, 1, 1, 0], -0.5),
    ]
    sequences = []
    for prompt, completion, mask, advantage in trajectories:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        own = logits.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()
        behaviour = [
            lp if bit else (-9.0 + 2 * k if scramble else 0.0) for k, (lp, bit) in enumerate(zip(own, mask))
        ]
        sequences.append(TrainingSequence(prompt, completion, behaviour, advantage, completion_mask=mask))
    return sequences


def _loss_and_gradients(model, sequences, layout: str) -> tuple[float, list[torch.Tensor]]:
    """The trainer's loss (grpo, token-normalised) and its gradients over one micro-batch."""
    model.zero_grad(set_to_none=True)
    micro = pack(sequences) if layout == "packed" else collate(sequences, pad_id=0)
    logprobs, _ = completion_logprobs(model, micro, temperature=1.0)
    clipped = policy_token_loss(
        "grpo", logprobs, micro.old_logprobs, micro.advantages, micro.completion_mask,
        eps_low=0.2, eps_high=0.2, delta=4.0,
    )  # fmt: skip
    loss = reduce_loss(clipped.loss, micro.completion_mask, "token", sum(s.model_tokens for s in sequences))
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters()]


def _reference(model, sequences) -> tuple[float, list[torch.Tensor]]:
    """The same objective written out by hand over the model's tokens only: at ratio 1 its gradient is
    -sum(A * grad logp) over the model tokens, divided by their count."""
    model.zero_grad(set_to_none=True)
    count = sum(s.model_tokens for s in sequences)
    total = 0.0
    for s in sequences:
        logits = model(torch.tensor([s.prompt_ids + s.completion_ids])).logits[0, len(s.prompt_ids) - 1 : -1]
        logp = logits.log_softmax(-1).gather(1, torch.tensor(s.completion_ids)[:, None])[:, 0]
        picked = logp[torch.tensor(s.model_positions())]
        total = total - s.advantage * torch.exp(picked - picked.detach()).sum() / count
    total.backward()
    return float(total.detach()), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_environment_tokens_never_reach_the_loss_or_its_gradient(model, layout):
    """The loss and gradients equal the hand-written objective over the model's tokens, whatever
    logprobs the environment's tokens carry: were those tokens targets, their nonsense logprobs would
    change both."""
    expected_loss, expected = _reference(model, _sequences(model, scramble=False))
    for scramble in (False, True):
        loss, gradients = _loss_and_gradients(model, _sequences(model, scramble), layout)
        assert loss == pytest.approx(expected_loss, abs=1e-6)
        for got, want in zip(gradients, expected):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


# --- genesys train on an environment ------------------------------------------------------------------


class RecordingTrainer(Trainer):
    """Keeps the training sequences of each step."""

    seen: list[list[TrainingSequence]] = []

    def _sequences(self, step):
        sequences, truncated = super()._sequences(step)
        type(self).seen.append(sequences)
        return sequences, truncated


class ScramblingTrainer(Trainer):
    """Gives the environment's tokens nonsense behaviour logprobs before the batch is trained on."""

    def _sequences(self, step):
        sequences, truncated = super()._sequences(step)
        scrambled = [
            replace(
                s,
                behaviour_logprobs=[
                    lp if bit else 5.0 - k
                    for k, (lp, bit) in enumerate(zip(s.behaviour_logprobs, s.completion_mask))
                ],
            )
            for s in sequences
        ]
        return scrambled, truncated


def test_online_training_plays_the_environment_and_starts_on_policy(tiny_model, tmp_path, plugin_env):
    RecordingTrainer.seen = []
    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    held_out = digit_tasks(tmp_path / "held_out.jsonl", count=2, task_type=TURNS_TASK_TYPE)
    evaluated = {"tasks": [str(held_out)], "every": 1, "samples": 2}
    result = train(config(tiny_model, tmp_path / "run", tasks, eval=evaluated), trainer=RecordingTrainer)
    first = result.metrics[0]
    assert first["eval/held_out/errors"] == 0 and first["eval/held_out/accuracy"] is not None  # played too
    assert first["logprob_mismatch"] <= TOLERANCE  # every model token's logprob recomputes exactly
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and first["ratio_max"] <= 1 + TOLERANCE
    [sequences] = RecordingTrainer.seen
    assert len(sequences) == 32
    for s in sequences:
        assert (
            s.completion_mask is not None and 0 in s.completion_mask
        )  # two turns, the environment's between
        assert s.completion_mask[0] == 1 and 2 <= s.model_tokens <= 2 * 12
    assert first["tokens"] == sum(s.model_tokens for s in sequences)  # the loss counts model tokens only


def test_nonsense_logprobs_at_the_environments_tokens_change_nothing_in_training(
    tiny_model, tmp_path, plugin_env
):
    from safetensors.torch import load_file

    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    plain = train(config(tiny_model, tmp_path / "plain", tasks))
    scrambled = train(config(tiny_model, tmp_path / "scrambled", tasks), trainer=ScramblingTrainer)
    for key in ("loss", "grad_norm", "tokens", "ratio_mean"):
        assert scrambled.metrics[0][key] == pytest.approx(plain.metrics[0][key], abs=1e-7), key
    weights = load_file(plain.final_dir / "model.safetensors")
    for name, tensor in load_file(scrambled.final_dir / "model.safetensors").items():
        torch.testing.assert_close(tensor, weights[name], atol=0, rtol=0)


def test_a_recorded_trajectory_with_a_bad_mask_is_refused_naming_it(tiny_model, tmp_path):
    row = {
        "prompt": "p",
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4],
        "completion_logprobs": [-1.0, 0.0],
        "reward": 1.0,
    }
    rollouts = write_jsonl(tmp_path / "rollouts.jsonl", [row, {**row, "completion_mask": [1, 2]}])
    with pytest.raises(
        InputError,
        match=r"rollouts.jsonl:2: completion_mask must be a list of one 0 or 1 per completion token \(2\)",
    ):
        train(config(tiny_model, tmp_path / "run", data={"rollouts": [str(rollouts)]}))


@pytest.mark.slow
def test_offline_training_from_a_trajectory_file_written_by_generate(tiny_model, tmp_path, plugin_env):
    tasks = digit_tasks(tmp_path / "tasks.jsonl", count=4, task_type=TURNS_TASK_TYPE)
    rollouts = tmp_path / "trajectories.jsonl"
    generate = [
        GENESYS, "generate", "--tasks", str(tasks), "--model", tiny_model, "-o", str(rollouts), "-n", "4",
        "--max-tokens", "8", "--backend", "transformers", "--verify", "--workers", "1", "--no-progress",
    ]  # fmt: skip
    subprocess.run(generate, check=True, env=plugin_env, capture_output=True, timeout=600)
    rows = read_jsonl(rollouts)
    assert all(row["turns"] == 2 and 0 in row["completion_mask"] for row in rows)
    run = tmp_path / "run"
    trained = subprocess.run(
        [
            GENESYS, "train", "--model", tiny_model, "-o", str(run), "--data.rollouts", str(rollouts),
            "--rollout.prompts-per-step", "4", "--optim.steps", "2", "--loss.recompute-logprobs", "--no-progress",
        ],
        env=plugin_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    first = read_jsonl(run / "metrics.jsonl")[0]
    assert first["logprob_mismatch"] <= TOLERANCE  # the recorded logprobs are the model's own
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["problem_id"], []).append(row)
    with_signal = [
        g for g in groups.values() if len({row["reward"] for row in g}) > 1
    ]  # the filter keeps these
    assert first["groups_kept"] == len(with_signal) >= 1
    assert first["tokens"] == sum(sum(row["completion_mask"]) for g in with_signal for row in g)


@pytest.mark.slow
@pytest.mark.parametrize("lr, climbs", [(3e-3, True), (0.0, False)])
def test_a_tiny_model_learns_a_two_turn_task_and_does_not_without_a_learning_rate(
    tiny_model, tmp_path, plugin_env, lr, climbs
):
    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    result = train(
        config(
            tiny_model, tmp_path / "run", tasks, sampling={"max_tokens": 16}, optim={"steps": 50, "lr": lr}
        )
    )
    rewards = [m["reward_mean"] for m in result.metrics]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert start < 0.1
    if climbs:
        assert end >= 0.8, rewards
    else:
        assert end < 0.1, rewards


# --- overlong masking and dr_grpo's constant on trajectories -----------------------------------------


def _trajectory_row(finish_reason: str, mask: list[int]) -> dict[str, Any]:
    return {
        "task_type": TURNS_TASK_TYPE,
        "prompt_ids": [1],
        "completion_ids": list(range(len(mask))),
        "completion_mask": mask,
        "finish_reason": finish_reason,
    }


def test_a_trajectory_is_truncated_when_cut_at_max_turns_or_with_its_last_turn_at_the_token_limit():
    from genesys.train.trainer import _truncated

    assert _truncated(_trajectory_row("max_turns", [1, 1, 0, 1]), max_tokens=4)
    assert _truncated(_trajectory_row("done", [1, 0, 0, 1, 1, 1, 1, 0]), max_tokens=4)  # last turn cut
    assert not _truncated(_trajectory_row("done", [1, 1, 1, 1, 0, 1, 1, 0]), max_tokens=4)  # first turn only
    assert not _truncated(_trajectory_row("error", [1, 0, 1]), max_tokens=4)


class DenominatorTrainer(RecordingTrainer):
    """Records the training sequences and the loss denominators of its steps."""

    denominators: list[float] = []

    def _loss_denominator(self, batch, part):
        value = super()._loss_denominator(batch, part)
        type(self).denominators.append(value)
        return value


def test_dr_grpos_constant_is_the_model_token_budget_of_the_trajectories(tiny_model, tmp_path, plugin_env):
    DenominatorTrainer.denominators, RecordingTrainer.seen = [], []
    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    sections = {"loss": {"type": "dr_grpo", "scale_by_std": False}, "sampling": {"max_tokens": 6}}
    train(config(tiny_model, tmp_path / "run", tasks, **sections), trainer=DenominatorTrainer)
    [sequences] = RecordingTrainer.seen
    # digit_turns plays two turns of at most 6 model tokens: 12 per trajectory, environment tokens aside
    assert all(s.max_model_tokens == 12 for s in sequences)
    assert DenominatorTrainer.denominators[0] == 12 * len(sequences)


def test_mask_truncated_leaves_trajectories_with_a_cut_last_turn_out_of_the_loss(
    tiny_model, tmp_path, plugin_env
):
    RecordingTrainer.seen = []
    tasks = digit_tasks(tmp_path / "tasks.jsonl", task_type=TURNS_TASK_TYPE)
    sections = {"sampling": {"max_tokens": 3}, "loss": {"mask_truncated": True}}
    first = train(config(tiny_model, tmp_path / "run", tasks, **sections), trainer=RecordingTrainer).metrics[
        0
    ]
    [kept] = RecordingTrainer.seen
    assert first["truncated_masked"] > 0  # the random model rarely stops within 3 tokens
    for s in kept:  # what is left ends its last turn on a stop token within the limit
        last = [i for i, bit in enumerate(s.completion_mask) if bit]
        end = last[-1] + 1
        start = max(i for i in range(end) if i == 0 or not s.completion_mask[i - 1])
        assert end - start < 3
    assert first["tokens"] == sum(s.model_tokens for s in kept)
