"""The CPU trainer's thread count: chosen by timing, the fewest threads within the margin, the user's
OMP_NUM_THREADS left alone, nothing chosen on other devices."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from genesys.threads import ThreadTuner, choose  # noqa: E402


def test_the_fewest_threads_within_the_margin_of_the_fastest_are_chosen():
    assert choose({1: 0.010, 2: 0.005}, margin=0.15) == 2  # two threads clearly faster
    assert choose({1: 0.0055, 2: 0.005}, margin=0.15) == 1  # within 15%: one thread, one core left free
    assert choose({1: 0.001, 2: 0.016}) == 1  # a busy machine: parallel work waits for its threads


def test_the_tuner_sets_the_count_it_measured_fastest_and_measures_again_every_n_steps(monkeypatch):
    previous = torch.get_num_threads()
    calls: list[int] = []

    def probe() -> None:  # pretend two threads are slower (not by PRUNE times), as on a loaded machine
        calls.append(torch.get_num_threads())
        time.sleep(0.03 if torch.get_num_threads() > 1 else 0.02)

    try:
        tuner = ThreadTuner(probe, candidates=(1, 2), every=10)
        tuner.maybe_tune(0)
        assert tuner.threads == 1 and torch.get_num_threads() == 1
        assert calls == [1, 2] * 5  # 5 alternating rounds of each
        tuner.maybe_tune(3)
        assert len(calls) == 10  # not due
        tuner.maybe_tune(10)
        assert len(calls) == 20
    finally:
        torch.set_num_threads(previous)


def test_one_lucky_round_of_two_threads_does_not_outweigh_the_others(monkeypatch):
    import genesys.threads as threads_module

    previous = torch.get_num_threads()
    clock = [0.0]
    two_thread_rounds = iter([0.001, 0.02, 0.02, 0.02, 0.02])  # one lucky round, as on a busy machine

    def probe() -> None:  # the probe's duration, on a clock of its own
        clock[0] += next(two_thread_rounds) if torch.get_num_threads() > 1 else 0.005

    monkeypatch.setattr(threads_module.time, "perf_counter", lambda: clock[0])
    try:
        tuner = ThreadTuner(probe, candidates=(1, 2))
        assert tuner.tune() == 1
        assert tuner.last_timings == {1: pytest.approx(0.005), 2: pytest.approx(0.02)}
    finally:
        torch.set_num_threads(previous)


def test_a_count_far_slower_than_the_fastest_is_not_timed_again():
    previous = torch.get_num_threads()
    calls: list[int] = []

    def probe() -> None:  # two threads PRUNE times slower and more: a busy machine
        calls.append(torch.get_num_threads())
        time.sleep(0.5 if torch.get_num_threads() > 1 else 0.01)

    try:
        tuner = ThreadTuner(probe, candidates=(1, 2))
        assert tuner.tune() == 1
        assert calls == [1, 2, 1, 2, 1, 1, 1]  # after two rounds one thread alone is timed
    finally:
        torch.set_num_threads(previous)


def test_no_tuner_where_the_count_is_not_ours_to_choose(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert ThreadTuner.for_device(torch.device("cpu"), lambda: None) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert ThreadTuner.for_device(torch.device("cuda"), lambda: None) is None


def test_the_forward_probe_runs_the_model_in_eval_mode_and_restores_its_mode():
    from genesys.threads import forward_probe

    modes: list[bool] = []

    class Model(torch.nn.Module):
        def forward(self, input_ids, use_cache):
            modes.append(self.training)
            assert input_ids.shape == (4, 64) and int(input_ids.max()) < 10 and not use_cache

    model = Model().train()
    probe = forward_probe(model, 10, "cpu")
    probe()
    probe()
    assert modes == [False, False] and model.training
