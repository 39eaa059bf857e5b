"""python -m bertjax.vocab train: learn a vocabulary from text files (bertjax.text.vocab_learning does the learning).

    python -m bertjax.vocab train --input='corpus/*.txt.gz' --vocab_size=30522 \\
        --kind=wordpiece --out=vocab.txt [--lower_case=true] [--max_sentences=N]
"""

import time

from absl import flags

from bertjax.runs import console
from bertjax.text import tokenizers
from bertjax.text import vocab_learning as vocabularies


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    defined = dict(
        input=flags.DEFINE_string("input", None, "Text files, one sentence or paragraph per line (.gz too); "
                                  "comma-separated globs."),
        vocab_size=flags.DEFINE_integer("vocab_size", None, "Vocabulary size to learn, special tokens included."),
        kind=flags.DEFINE_enum("kind", "wordpiece", ["wordpiece", "sentencepiece"], "Tokenizer to learn."),
        out=flags.DEFINE_string("out", None, "vocab.txt for wordpiece; the .model for sentencepiece "
                                "(a .vocab is written beside it)."),
        lower_case=flags.DEFINE_boolean("lower_case", True, "Uncased: lower-case (and, for wordpiece, strip "
                                        "accents)."),
        max_sentences=flags.DEFINE_integer("max_sentences", None, "Read at most this many non-blank lines."),
    )
    flags.mark_flags_as_required(["input", "vocab_size", "out"])
    return defined


def main(argv, args):
    # Mistakes end in console.fail: one line on stderr and exit code 2, like a bad flag.
    if argv[1:] != ["train"]:
        console.fail(f"expected the command `train`, got {' '.join(argv[1:]) or 'none'}: "
                     "python -m bertjax.vocab train --input=GLOB --vocab_size=N --out=PATH")
    start = time.time()
    try:
        sentences = vocabularies.read_text_lines(args.input, max_lines=args.max_sentences)
        if args.kind == "wordpiece":
            path = vocabularies.learn_wordpiece_vocab(sentences, args.vocab_size, lower_case=args.lower_case,
                                                      out_path=args.out)
            size = len(tokenizers.load_vocab(path))
        else:
            path = vocabularies.learn_sentencepiece_model(sentences, args.vocab_size, out_path=args.out,
                                                          lower_case=args.lower_case)
            size = tokenizers.SentencePieceTokenizer(path).vocab_size
    except FileNotFoundError as e:
        console.fail(f"--input={args.input}: {e}")
    except ValueError as e:
        console.fail(str(e))
    print(f"wrote {args.kind} vocabulary of {size} tokens to {path} in {time.time() - start:.1f} s")
    if size < args.vocab_size:
        print(f"note: the text gives fewer distinct pieces than --vocab_size={args.vocab_size}")


def entry():
    """The console program: `bertjax-vocab train ...`, as `python -m bertjax.vocab train ...`."""
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
