"""TensorFlow for the host's work only (tokenizing, reading and masking text): the accelerators belong to JAX.

Left alone, TensorFlow claims every visible GPU's memory on its first op, which the JAX model beside it
needs. Every module of the library that uses TensorFlow gets it here, at its top:

    tf = tf_cpu.import_tensorflow()

so that whichever of them is imported first, TensorFlow's GPUs are hidden before it can run an op; the
model, the step and the synthetic data path import none of them (tests/test_layout.py).
"""

import logging

log = logging.getLogger(__name__)
_hidden = False


def import_tensorflow():
    """The tensorflow module, its GPUs hidden from it (once per process)."""
    global _hidden
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
    import tensorflow_text  # registers its ops with the TensorFlow imported just above

    return tensorflow_text
