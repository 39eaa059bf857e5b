"""Batch-size warmup (bertjax/training/batch_warmup.py): the staircase of microbatches and the stream
position in closed form, the host's buffer as the step splits it, the step using only the first k
microbatches, the settings refused in one line, and a run resumed mid-warmup giving the uninterrupted
run's losses exactly."""

import itertools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import copy_of, small_run_settings, tiny_config, train_losses

from bertjax.runs import config_checks
from bertjax.training import optim
from bertjax.training.batch_warmup import BatchWarmup, batches_by_step, host_batch
from configs import modernbert_base, modernbert_large


@pytest.mark.parametrize("start,most,steps", [(1, 6, 21_200), (1, 3, 4), (2, 5, 7), (1, 2, 1), (3, 11, 100)])
def test_staircase_and_position_in_closed_form(start, most, steps):
    warmup = BatchWarmup(microbatch=4, start_microbatches=start, max_microbatches=most, steps=steps)
    upto = steps + 10
    ks = [warmup.microbatches(n) for n in range(upto)]
    assert ks[0] == start and ks[steps:] == [most] * 10 and ks == sorted(ks)
    assert set(ks) == set(range(start, most + 1))  # every size in between, each for a share of the steps
    every = max(1, steps // 200)
    assert [int(warmup.microbatches_on_device(n)) for n in range(0, upto, every)] == ks[::every]
    positions = [0, *itertools.accumulate(ks)]  # microbatches the steps before N took, counted one by one
    assert all(warmup.position(n) == positions[n] for n in range(0, upto + 1, every))
    assert warmup.batch_size(0) == 4 * start and warmup.batch_size(steps) == 4 * most


def test_the_host_buffer_gives_the_step_its_microbatches_in_order():
    """host_batch's rows, split as optim.accumulate_gradients splits a batch: microbatch i is the i-th given,
    those after the k given are zeros."""
    parts = [{"x": np.arange(6).reshape(3, 2) + 100 * i} for i in range(2)]
    buffer = host_batch(parts, max_microbatches=3)
    assert buffer["x"].shape == (9, 2)
    split = np.asarray(optim._strided_microbatches({"x": jnp.asarray(buffer["x"])}, 3)["x"])
    np.testing.assert_array_equal(split[0], parts[0]["x"])
    np.testing.assert_array_equal(split[1], parts[1]["x"])
    assert not split[2].any()


def test_accumulating_the_first_k_microbatches_of_the_buffer():
    """One compiled function for every k: the first k microbatches' mean, as accumulating them alone."""

    def loss_and_grad(params, batch, rng):
        def loss(w):
            return jnp.mean((batch["x"] @ w - batch["y"]) ** 2), {"count": jnp.float32(batch["x"].shape[0])}
        return jax.value_and_grad(loss, has_aux=True)(params)

    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(3,)), jnp.float32)
    parts = [{"x": rng.normal(size=(4, 3)).astype(np.float32), "y": rng.normal(size=(4,)).astype(np.float32)}
             for _ in range(3)]
    key = jax.random.key(0)
    upto = jax.jit(lambda b, k: optim.accumulate_gradients(loss_and_grad, w, b, 4, key, count=k))
    for k in (1, 2, 3):
        (loss, sums), grads = upto(host_batch(parts[:k], 4), jnp.int32(k))
        alone = host_batch(parts[:k], k)  # the same k microbatches in a batch of their own, no padding
        (want_loss, _), want_grads = optim.accumulate_gradients(loss_and_grad, w, alone, k, key)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        np.testing.assert_allclose(grads, want_grads, rtol=1e-6)
        assert float(sums["count"]) == 4 * k


class CountingStream:
    """A stream whose element i is {"input_mask": [i]}, batched as PretrainingStream.dataset batches."""

    def dataset(self, batch_size, start_step=0):
        batches = ({"input_mask": np.arange(b * batch_size, (b + 1) * batch_size)[:, None]}
                   for b in itertools.count(start_step))
        return type("Batches", (), {"as_numpy_iterator": lambda self: batches})()


def test_the_preview_shows_each_step_s_examples_as_training_takes_them():
    """bertjax.preview --start_step=N with a warmup: the examples of step N are microbatches P(N) .. P(N) + k(N) - 1."""
    warmup = BatchWarmup(microbatch=2, start_microbatches=1, max_microbatches=3, steps=4)  # k: 1 1 2 2 3 3 ...
    for start in (0, 3):
        got = itertools.islice(batches_by_step(CountingStream(), 6, warmup, start), 4)
        for step, (first, batch) in enumerate(got, start):
            begin = 2 * warmup.position(step)
            assert first == begin and batch["input_mask"][:, 0].tolist() == list(
                range(begin, begin + warmup.batch_size(step)))


@pytest.mark.parametrize("settings,message", [
    ({"train.batch_warmup_start": 12}, "train.batch_warmup_start=12 is not a whole number of microbatches of 8 "
                                       "sequences (train.batch_size=32 / train.grad_accum_steps=4): set it to a "
                                       "multiple of 8"),
    ({"train.batch_warmup_start": 32}, "train.batch_warmup_start=32 must be below train.batch_size=32"),
    ({"train.batch_warmup_start": 8, "train.batch_warmup_steps": 0},
     "train.batch_warmup_steps=0 must be a positive number of steps with train.batch_warmup_start=8"),
    ({"train.batch_warmup_start": -8}, "train.batch_warmup_start=-8 must be a whole number of sequences"),
    ({"train.batch_warmup_start": 8, "data.mask_rate_schedule": ((0, 0.3), (10, 0.15))},
     "data.mask_rate_schedule changes the rate by step"),
])
def test_a_bad_batch_warmup_is_one_line_naming_the_key(settings, message):
    config = tiny_config({"train.grad_accum_steps": 4, "train.batch_warmup_steps": 10, **settings})
    with pytest.raises(ValueError) as error:
        config_checks.check_pretraining(config)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("module,start,warmup_tokens", [(modernbert_base, 768, 50e9), (modernbert_large, 448, 10e9)],
                         ids=["base", "large"])
def test_modernbert_configs_hold_the_paper_s_token_counts(module, start, warmup_tokens):
    """Warner et al. 2024: the batch warmed up from `start` over the first 50B (large: 10B) tokens, the learning
    rate over 3B, 1.7T tokens in all, all converted to steps through the staircase's own tokens."""
    config = module.get_config()
    config_checks.check_pretraining(config)
    warmup = BatchWarmup.from_config(config.train)
    assert warmup.batch_size(0) == start and warmup.batch_size(warmup.steps) == config.train.batch_size
    tokens = lambda step: warmup.position(step) * warmup.microbatch * config.data.max_seq_length  # noqa: E731
    assert tokens(warmup.steps) == pytest.approx(warmup_tokens, rel=0.002)
    assert tokens(config.schedule.warmup_steps) == pytest.approx(3e9, rel=0.002)
    assert tokens(config.train.num_steps) == pytest.approx(1.7e12, rel=0.002)
    assert config.optimizer.name == "decoupled_stable_adamw"
    assert (config.optimizer.b1, config.optimizer.b2) == (0.9, 0.98)


WARMUP = {"train.batch_size": 24, "train.grad_accum_steps": 3, "train.batch_warmup_start": 8,
          "train.batch_warmup_steps": 4, "train.num_steps": 5, "checkpoint.every_steps": 3,
          "logging.eval_every": 100, "logging.eval_batches": 1}


@pytest.mark.slow
def test_a_run_resumed_mid_warmup_gives_the_uninterrupted_losses(small_run, tmp_path, capsys):
    """small_run's settings with the batch growing 8 -> 16 -> 24 over 4 steps (microbatches of 8): resumed
    from the checkpoint of step 3, in the middle of the warmup, steps 4 and 5 are the uninterrupted run's,
    bit for bit; metrics.jsonl and the console say the batch of each step."""
    from bertjax.runs import pretraining

    settings = small_run_settings(small_run["corpus"], **WARMUP)
    whole = tmp_path / "whole"
    pretraining.pretrain(tiny_config(settings), str(whole))
    lines = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in lines if "split" not in r] == [8, 8, 16, 16, 24]
    assert "| batch 16 |" in capsys.readouterr().out

    resumed = copy_of(whole, tmp_path / "resumed")
    shutil.rmtree(resumed / "checkpoints" / "5")  # as if killed after the checkpoint of step 3
    pretraining.pretrain(tiny_config(settings), str(resumed))
    assert "resumed from step 3" in capsys.readouterr().out
    expected, got = train_losses(whole), train_losses(resumed)
    assert [got[4], got[5]] == [expected[4], expected[5]]  # exactly
