"""A checkpoint written on one mesh resumes on another (other device counts, other axes): the later
losses equal those of a run that never moved, within float32 tolerance."""

import jax
import numpy as np
import pytest

from bertjax.training import checkpoint
from bertjax.training import sharding
from bertjax.training import pretraining_step
from bertjax.training import state as train_state
from bertjax.data import synthetic
from bertjax.training.checkpoint_meta import CheckpointMeta
from test_train import small_config  # tests/ is on sys.path under pytest


class Run:
    """The trainer's state and step on one mesh, as bertjax.train builds them."""

    def __init__(self, config, mesh_shape, devices):
        self.config = config
        self.mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)), devices)
        rules = sharding.logical_rules(config.logical_axis_rules)
        self.init_key, self.dropout_key = train_state.root_keys(config.train.seed)
        self.setup = pretraining_step.setup(config, self.mesh, rules, self.init_key)
        self.data_sharding = sharding.batch_sharding(self.mesh, rules)
        self.step_fn, _ = self.setup.compile_steps(self.data_sharding, 1)

    def steps(self, state, start, stop):
        losses = []
        with jax.set_mesh(self.mesh):
            for step in range(start, stop):
                host = synthetic.synthetic_batch(step, batch_size=16, max_seq_length=32, max_predictions_per_seq=5,
                                                 vocab_size=96)
                state, sums = self.step_fn(state, sharding.global_batch(host, self.data_sharding), self.dropout_key)
                losses.append(float(sums["loss_sum"]))
        return state, losses


@pytest.fixture(scope="module")
def stayed(tmp_path_factory):
    """Per mesh (shape, devices): the checkpoint of step 3 written there, and the run that stays there to step
    6 (its losses and parameters), made once for the cases that start on that mesh."""
    runs = {}

    def on(mesh_shape, num_devices):
        if (mesh_shape, num_devices) not in runs:
            first = Run(small_config(), mesh_shape, jax.devices()[:num_devices])
            state, _ = first.steps(first.setup.init(first.init_key), 0, 3)
            directory = tmp_path_factory.mktemp("step3")
            saver = checkpoint.Checkpointer(str(directory), every_steps=1, keep=1, async_save=False)
            saver.save(3, state.params, state.opt_state, CheckpointMeta(3, {}), force=True)
            saver.wait()
            saver.close()
            never_moved, losses = first.steps(state, 3, 6)  # the run that stays on its mesh
            runs[mesh_shape, num_devices] = directory, losses, jax.device_get(never_moved.params)
        return runs[mesh_shape, num_devices]

    return on


@pytest.mark.slow
@pytest.mark.parametrize("before,after", [
    (((8, 1, 1), 8), ((2, 1, 1), 2)),   # 8 devices -> 2
    (((1, 1, 1), 1), ((8, 1, 1), 8)),   # 1 -> 8
    (((8, 1, 1), 8), ((1, 4, 2), 8)),   # data parallel -> fsdp and tensor
])
@pytest.mark.mesh
def test_a_checkpoint_resumes_on_another_mesh(stayed, before, after):
    directory, losses_after_ref, never_moved = stayed(*before)

    # The checkpoint of step 3, restored onto the other mesh.
    second = Run(small_config(), after[0], jax.devices()[:after[1]])
    reader = checkpoint.Checkpointer(str(directory), every_steps=1, keep=1, async_save=False)
    restored = reader.restore_latest(second.setup.abstract_state.params, second.setup.abstract_state.opt_state)
    reader.close()
    assert restored.step == 3
    kernel = restored.params["bert"]["encoder"]["layers_1"]["mlp"]["intermediate"]["kernel"]
    assert kernel.sharding.mesh.shape == second.mesh.shape  # restored straight into the new layout
    moved = train_state.TrainState(jax.numpy.int32(3), restored.params, restored.opt_state)
    moved, losses_after = second.steps(moved, 3, 6)
    np.testing.assert_allclose(losses_after, losses_after_ref, rtol=2e-5)
    for a, b in zip(jax.tree_util.tree_leaves(moved.params), jax.tree_util.tree_leaves(never_moved)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
