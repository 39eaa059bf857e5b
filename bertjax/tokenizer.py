"""`python -m bertjax.tokenizer train ...`: the older spelling of `python -m bertjax.text.vocab train ...`."""

from bertjax.text.vocab import entry

if __name__ == "__main__":
    entry()
