"""TensorFlow for the host's work only (tokenizing, reading and masking text): the accelerators belong to JAX.

Left alone, TensorFlow claims every visible GPU's memory on its first op, which the JAX model beside it
needs. Every module of the library that uses TensorFlow gets it here, at its top:

    tf = tf_cpu.import_tensorflow()

(tensorflow_text and TFDS, which import TensorFlow themselves, through import_tensorflow_text and
import_tensorflow_datasets), so that whichever of them is imported first, TensorFlow's GPUs are hidden
before it can run an op; the model, the step and the synthetic data path import none of them, and the
few modules they do import that read TFDS on request call these inside the function that reads it
(tests/test_layout.py).

TensorFlow's native libraries also log their start-up (oneDNN and CPU-feature notices, a missing CUDA
driver, a failed cuInit) straight to the process's stderr, whatever TF_CPP_MIN_LOG_LEVEL says. That start-up
happens here, once, with those known lines dropped; anything else it prints is passed on.
"""

import contextlib
import logging
import os
import sys
import tempfile

log = logging.getLogger(__name__)
_hidden = False

# Lines of TensorFlow's native start-up that say nothing about the user's run.
START_UP_NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "] oneDNN custom operations are on",
    "] Could not find cuda drivers on your machine",
    "] This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions:",
    "] failed call to cuInit",
    "] Unable to register cu",  # cuDNN / cuFFT / cuBLAS factories registered twice
    "Logging before InitGoogle() is written to STDERR",
)


@contextlib.contextmanager
def start_up_noise_dropped():
    """What the native code writes to stderr inside, less the START_UP_NOISE lines, written out after."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedding host): nothing to filter
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not any(noise in line for noise in START_UP_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow():
    """The tensorflow module, its GPUs hidden from it (once per process)."""
    global _hidden
    with start_up_noise_dropped():
        import tensorflow as tf  # here alone: the GPUs are hidden below before any op runs

        if not _hidden:
            try:
                tf.config.set_visible_devices([], "GPU")
            except RuntimeError:  # TF was initialised already (by the caller): its device choice stands
                if tf.config.get_visible_devices("GPU"):
                    log.warning("TensorFlow was initialised before bertjax could hide the GPUs from it: it may "
                                "take GPU memory JAX needs (import it through bertjax.text.tf_cpu first)")
            _hidden = True
    return tf


def import_tensorflow_text():
    """The tensorflow_text module (the tokenizer's ops), after import_tensorflow()."""
    import_tensorflow()
    with start_up_noise_dropped():
        import tensorflow_text  # registers its ops with the TensorFlow imported just above
    return tensorflow_text


def import_tensorflow_datasets():
    """The tensorflow_datasets module, after import_tensorflow(): TFDS imports TensorFlow itself."""
    import_tensorflow()
    with start_up_noise_dropped():
        import tensorflow_datasets  # imports TensorFlow, whose GPUs import_tensorflow() has just hidden
    return tensorflow_datasets
