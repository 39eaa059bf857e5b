"""python -m bertjax.plan: the train step compiled for a TPU slice on this CPU machine (libtpu).

The planner runs in subprocesses: libtpu stays out of the test process.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/tiny.py at sequences of 32 and a vocabulary of 512: the TPU compiler's time follows the shapes.
TINY = ["--config=configs/tiny.py", "--config.data.source=synthetic", "--config.data.max_seq_length=32",
        "--config.data.max_predictions_per_seq=5", "--config.model.vocab_size=512"]


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)  # the tests' virtual CPU devices are nothing to the TPU compiler
    return env


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "bertjax.plan", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_parse_topology_names():
    from bertjax.bench import tpu_plan

    assert tpu_plan.parse_topology("v4-32").libtpu_name == "v4:2x2x4"  # 32 TensorCores = 16 chips
    assert tpu_plan.parse_topology("v5p-128").libtpu_name == "v5p:4x4x4"
    assert tpu_plan.parse_topology("v5p-1024").libtpu_name == "v5p:8x8x8"
    assert tpu_plan.parse_topology("v5e-256").libtpu_name == "v5e:16x16"
    assert tpu_plan.parse_topology("v5litepod-8").libtpu_name == "v5e:2x4"
    assert tpu_plan.parse_topology("v6e-64").libtpu_name == "v6e:8x8"
    for bad in ("v9-8", "v4-6", "v5p-2", "v5e-512", "tpu", ""):
        with pytest.raises(ValueError):
            tpu_plan.parse_topology(bad)


def test_count_collectives():
    from bertjax.bench import tpu_plan

    hlo = """
  %all-reduce.1 = f32[4]{0} all-reduce(f32[4]{0} %p), replica_groups={{0,1}}, to_apply=%add
  %ag = (f32[4], f32[8]) all-gather-start(f32[4]{0} %q), dimensions={0}
  %agd = f32[8]{0} all-gather-done((f32[4], f32[8]) %ag)
  %cp = f32[4]{0} collective-permute(f32[4]{0} %r), source_target_pairs={{0,1}}
"""
    assert tpu_plan.count_collectives(hlo) == {"all-reduce": 1, "all-gather": 1, "reduce-scatter": 0,
                                           "all-to-all": 0, "collective-permute": 1}


def test_user_mistakes_give_one_line():
    procs = [
        _start(*TINY, "--topology=v9-8"),  # no such generation
        _start(*TINY, "--topology=v4-8", "--config.mesh.data=3"),  # 3 does not divide 4 chips
    ]
    for proc, words in zip(procs, (["unknown TPU topology", "v5p-128"], ["v4-8", "does not match the 4 devices"])):
        code, out, err = _finish(proc, timeout=120)
        assert code == 2, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err, err
        assert all(w in lines[0] for w in words), lines


@pytest.mark.slow
def test_plan_tiny_on_v5e_4():
    """Data parallel and FSDP over the 4 chips of a v5e-4, both compiled at once in two processes."""
    dp = _start(*TINY, "--topology=v5e-4", "--config.mesh.data=-1", "--json")
    fsdp = _start(*TINY, "--topology=v5e-4", "--config.mesh.data=1", "--config.mesh.fsdp=-1", "--json")
    plans = {}
    for name, proc in (("dp", dp), ("fsdp", fsdp)):
        code, out, err = _finish(proc)
        assert code == 0, err[-3000:]
        plans[name] = json.loads(out.strip().splitlines()[-1])
    dp, fsdp = plans["dp"], plans["fsdp"]
    assert dp["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1} and fsdp["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    for p in (dp, fsdp):
        assert p["chips"] == 4 and "v5 lite" in p["device_kind"].lower() and p["dtype"] == "bfloat16"
        assert p["fits"] is True and p["hbm_bytes"] == 16 * 2**30
        assert min(p["params_bytes"], p["opt_state_bytes"], p["batch_bytes"]) > 0 and p["temp_bytes"] >= 0
        assert p["total_bytes"] >= p["params_bytes"] + p["opt_state_bytes"] + p["batch_bytes"]
        assert p["compiled_flops"] > 0 and p["model_flops"] > 0 and 0 < p["mfu_bound"] <= 1
        assert p["batch_per_data_device"] == 8
    # Parameters and optimizer state are split over the chips with fsdp (the small, unsharded vectors
    # and scalars keep it from being exactly a quarter).
    assert fsdp["params_bytes"] < 0.4 * dp["params_bytes"]
    assert fsdp["opt_state_bytes"] < 0.4 * dp["opt_state_bytes"]
    # Data parallelism adds up the gradients with an all-reduce; FSDP gathers the parameters.
    assert dp["collectives"]["all-reduce"] > 0
    assert fsdp["collectives"]["all-gather"] + fsdp["collectives"]["reduce-scatter"] > 0
    # The same model at the same global batch: the same model FLOPs per chip.
    assert dp["model_flops"] == pytest.approx(fsdp["model_flops"])


@pytest.mark.mesh
def test_find_max_batch_search(monkeypatch):
    """Doubling then bisection, on a stand-in for the compiler: 1 GiB + 0.3 GiB per sequence, 16 GiB."""
    import jax

    from bertjax.bench import tpu_plan
    from configs import tiny

    config = tiny.get_config()
    config.mesh.data, config.mesh.fsdp = 2, 4  # batch over data x fsdp: 8 devices
    compiled = []

    def fake_compile(config, topology, devices, batch_size):
        per_device = batch_size // 8
        compiled.append(per_device)
        return {"fits": (1 + 0.3 * per_device) * 2**30 <= 16 * 2**30, "total_bytes": 0, "hbm_bytes": 16 * 2**30,
                "compile_seconds": 0.0, "batch_per_data_device": per_device}

    monkeypatch.setattr(tpu_plan, "compile_step", fake_compile)
    topology = tpu_plan.parse_topology("v5e-8")
    best, tried = tpu_plan.find_max_batch(config, topology, jax.devices()[:8], bisect_steps=10, start=4)
    assert best == 50 and compiled[:5] == [4, 8, 16, 32, 64] and len(tried) == len(compiled)
    best, _ = tpu_plan.find_max_batch(config, topology, jax.devices()[:8], bisect_steps=0, start=256)
    assert best == 32  # halving from 256 to the first fit, no bisection


def test_format_plan_of_a_step_the_compiler_refused():
    from bertjax.bench import tpu_plan

    p = dict(topology="v5e-4", libtpu_topology="v5e:2x2", chips=4, device_kind="TPU v5 lite", hbm_bytes=16 * 2**30,
             mesh={"data": 4, "fsdp": 1, "tensor": 1}, batch_size=4096, seq_len=128, batch_per_data_device=1024,
             grad_accum_steps=1, dtype="bfloat16", remat_policy="none", params_bytes=2**20, opt_state_bytes=2**21,
             batch_bytes=2**20, temp_bytes=40 * 2**30, total_bytes=40 * 2**30 + 4 * 2**20, fits=False,
             compiler_error="RESOURCE_EXHAUSTED: Ran out of memory on HBM", model_flops=1e12, compiled_flops=0.0,
             collectives={}, mfu_bound=None, compile_seconds=1.0)
    text = tpu_plan.format_plan(p)
    assert "NO: does not fit" in text and "RESOURCE_EXHAUSTED" in text and "not compiled" in text
    assert "  temporaries        40.00 GiB" in text and "MFU bound" not in text


def test_plan_modernbert_on_v5e_4():
    """ModernBERT's network (GeGLU, no biases, RoPE, a global layer 0 and sliding-window layers 1 and 2,
    pre-norm) compiled for a v5e-4 with FSDP, at modernbert_tiny's size: the TPU compiler takes minutes
    over modernbert_large's unrolled layers on 2 cores, even over three of them. The whole model, by hand:

        python -m bertjax.plan --config=configs/modernbert_large.py --topology=v5e-4 \
            --config.train.batch_size=32 --config.mesh.data=1 --config.mesh.fsdp=-1
    """
    code, out, err = _finish(_start("--config=configs/modernbert_tiny.py", "--topology=v5e-4",
                                    "--config.train.batch_size=8", "--config.mesh.data=1", "--config.mesh.fsdp=-1",
                                    "--json"))
    assert code == 0, err[-3000:]
    p = json.loads(out.strip().splitlines()[-1])
    assert p["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1} and p["dtype"] == "bfloat16"
    assert p["fits"] is True and p["compiled_flops"] > 0 and 0 < p["mfu_bound"] <= 1
    # The model formula per chip: L=3, H=128, F=192 gated, V=8192, S=128, p=40/128 (30% masking); the window
    # of 128 (129 keys) spans the whole sequence, so the local layers are charged S keys like the global one.
    from bertjax.training import flops

    per_token = flops.train_flops_per_token(3, 128, 128, 8192, 40 / 128, intermediate_size=192, gated=True)
    assert p["model_flops"] == pytest.approx(per_token * 8 * 128 / 4)


def test_choose_layout_takes_the_fastest_layout_that_fits(monkeypatch, capsys):
    """--topology=local --choose_layout: the first of LAYOUTS (unrolled without remat first) whose compiled
    step fits the devices' memory. Each layout's step is compiled for this CPU once; the budget is set just
    below the first one's memory, so the choice falls to the next layout that fits under it."""
    from bertjax.bench import tpu_plan
    from configs import tiny

    config = tiny.get_config()
    config.data.update(source="synthetic", max_seq_length=64, max_predictions_per_seq=8)
    config.model.update(vocab_size=512, attention_dropout_rate=0.0)
    config.train.batch_size = 16
    real, compiled = tpu_plan.compile_step, {}

    def compile_once(config, topology, devices, batch_size):
        """The real compile, once per layout; whether it fits judged against this topology's memory."""
        key = (config.model.scan_layers, config.model.remat_policy)
        if key not in compiled:
            compiled[key] = real(config, topology, devices, batch_size)
        hbm = topology.generation.hbm_bytes
        return dict(compiled[key], hbm_bytes=hbm, fits=compiled[key]["total_bytes"] <= hbm)

    monkeypatch.setattr(tpu_plan, "compile_step", compile_once)
    roomy, devices = tpu_plan.local_topology(memory_gib=64)
    totals = []
    for layout in tpu_plan.LAYOUTS:
        trial = config.copy_and_resolve_references()
        trial.model.update(layout)
        totals.append(compile_once(trial, roomy, devices, 16)["total_bytes"])
    budget = totals[0] - 1
    expected = next((layout for layout, total in zip(tpu_plan.LAYOUTS, totals) if total <= budget), None)
    assert expected is not None, f"no layout needs less than unrolled without remat here: {totals}"
    best, tried = tpu_plan.plan(config, "local", layout=True, memory_gib=budget / tpu_plan.GiB)
    assert best is None and tried[-1]["layout"] == expected and not tried[0]["fits"]
    tpu_plan.print_plans(best, tried, as_json=False)
    out = capsys.readouterr().out
    assert "layout: " + " ".join(f"--config.model.{k}={str(v).lower()}" for k, v in expected.items()) in out
