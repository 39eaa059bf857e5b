"""Test setup: eight virtual CPU devices, so that sharding is tested against one device on any machine.

XLA reads this flag once, when JAX starts, so it must be set before anything imports jax.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow must not grab accelerators or print its start-up banner during the tests.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
