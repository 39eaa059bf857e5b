"""bertjax: pretrain BERT-family encoders with JAX and Flax, from one CPU to a pod."""

import setuptools

setuptools.setup(
    name="bertjax",
    version="0.1.0",
    description="Faithful, sharded, exactly resumable BERT pretraining in JAX/Flax.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["bertjax", "bertjax.*"]),
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        # tensorflow-text needs the full tensorflow package; tensorflow-cpu would be
        # replaced by it anyway. Kept off accelerators at run time (see bertjax/data).
        "tensorflow>=2.16",
        "tensorflow-text>=2.16",
        "tensorflow-datasets>=4.9",
        "sentencepiece>=0.2",
        "ml_collections>=0.1.1",
        "absl-py>=2.0",
        "numpy>=1.26",
        "safetensors>=0.4",
    ],
    extras_require={
        # Reference implementations for the tests only; never imported by bertjax itself.
        "test": ["pytest>=8", "torch==2.13.0", "transformers>=4.40", "tensorboard>=2.16"],
    },
)
