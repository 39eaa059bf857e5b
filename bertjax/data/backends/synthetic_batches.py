"""data.source=synthetic: random batches of the configured shape for timing the step alone
(bertjax/data/synthetic.py, synthetic.from_settings). No corpus, no tokenizer, no TensorFlow: its
record offers neither documents nor corpora, so the input pipeline refuses it and the programs make its
batches themselves."""

from bertjax.data.backends.backend import Backend

BACKEND = Backend(name="synthetic", reads="random batches of the configured shape (bertjax.data.synthetic), no corpus")
