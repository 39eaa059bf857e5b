"""TensorFlow for the host's work only (tokenizing, reading and masking text): the accelerators belong to JAX.

Left alone, TensorFlow claims every visible GPU's memory on its first op, which the JAX model beside it
needs. Every place that uses TensorFlow next to JAX imports it through import_tensorflow().
"""

import logging

log = logging.getLogger(__name__)
_hidden = False


def import_tensorflow():
    """The tensorflow module, its GPUs hidden from it (once per process)."""
    global _hidden
    import tensorflow as tf

    if not _hidden:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # TF was initialised already (by the caller): its device choice stands
            if tf.config.get_visible_devices("GPU"):
                log.warning("TensorFlow was initialised before bertjax could hide the GPUs from it: it may "
                            "take GPU memory JAX needs (import it through bertjax.text.tf_cpu first)")
        _hidden = True
    return tf
