"""Text: tokenizers (tokenizers.py), vocabulary learning (vocab.py), sentence splitting (sentences.py)
and the text-file reader they share (files.py). Nothing here imports from bertjax.data."""
