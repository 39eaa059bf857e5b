"""bertjax: pretrain BERT-family encoders with JAX and Flax, from one CPU to a pod.

`import bertjax` is cheap: it imports neither JAX nor TensorFlow, and sets the process's environment
before they start (bertjax/environment.py: third-party start-up noise off). `bertjax.load(path)` loads a
model for notebooks (see bertjax/inference.py).
"""

from bertjax import environment

__version__ = "0.1.0"
environment.quiet_start_up()


def __getattr__(name):
    if name == "load":
        # Lazy, so that importing the package (e.g. for the synthetic-data benchmark) pulls in nothing heavy.
        from bertjax.inference import load

        return load
    raise AttributeError(f"module 'bertjax' has no attribute {name!r}")
