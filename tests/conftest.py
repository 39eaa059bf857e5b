"""Test setup: eight virtual CPU devices, so that sharding is tested against one device on any machine,
and XLA's CPU backend told to compile quickly.

XLA reads its flags once, when JAX starts, so they must be set before anything imports jax.
"""

import os
import tempfile

# The tests' models are tiny and take a few steps each, so compiling is most of their time: without
# LLVM's optimisation passes a step compiles in about half the time and runs a few times slower, which
# these shapes never notice. The results agree to float rounding, not bit for bit, so the programs the
# tests start get these flags too (their ENV): a run compared exactly with another is compiled alike. A
# test that trains for hundreds of steps asks for full optimisation.
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" {FAST_COMPILE_FLAGS} --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow must not grab accelerators or print its start-up banner during the tests.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# One persistent compilation cache for the whole run, shared by both xdist workers and every training
# subprocess they start (which inherit this environment): the many short runs of the same small configs
# compile the same programs, and compiling is most of their time.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"bertjax-tests-jax-cache-{_RUN}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
