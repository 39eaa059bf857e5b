"""python -m bertjax.export: a checkpoint handed to the tools everyone else uses.

    python -m bertjax.export --from=runs/tiny --to=exports/tiny-hf --format=hf
    python -m bertjax.export --from=runs/tiny --step=400 --to=exports/tiny-serving --format=savedmodel
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-params --format=params
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-int8 --format=params --quantize=int8
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-int4 --format=params --quantize=int4-g128
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-mixed --format=params --quantize=mixed \
        --size_budget=0.2 --dev=data/sst2/dev.jsonl
    python -m bertjax.export --from=runs/tiny --to=exports/tiny-st --format=sentence-transformers

--from is a pretraining or fine-tuning workdir (its newest checkpoint; a fine-tuning workdir its best
dev checkpoint; --step=N one step of its checkpoints/) or a checkpoint directory. Formats:
  hf          model.safetensors, config.json and the tokenizer's files: transformers' AutoTokenizer and
              the family's pretraining class (BertForPreTraining, RobertaForMaskedLM, ...; or the
              fine-tuned task's class, ModernBertForSequenceClassification, ...) load it with nothing
              missing or unused; --hf_class=masked_lm writes the masked-LM class's weights alone
              (BertForMaskedLM: no pooler, no NSP head), which AutoModelForMaskedLM and
              pipeline("fill-mask") load with nothing unused (bertjax/interop/hf.py)
  savedmodel  a TensorFlow SavedModel for TF Serving, signatures on raw strings
              (bertjax/interop/savedmodel.py)
  params      params.npz (the parameter tree, flattened with "/"), config.json and the vocabulary
  sentence-transformers
              a directory sentence_transformers.SentenceTransformer loads, whose encode gives what
              bertjax.load(...).embed gives: the hf export, then modules.json, 1_Pooling, optional
              2_Dense and Normalize, config_sentence_transformers.json (prompts, similarity) and
              sentence_bert_config.json, as the model's embedding record says (mean pooling where it
              has none); a fine-tuned classifier or regression of text pairs as a CrossEncoder
              directory, whose predict gives the head's logits (bertjax/interop/sentence_transformers.py)
--quantize=int8 (params, savedmodel): every dense layer's kernel stored as int8 with a float32 scale per
output channel, every embedding table as int8 with a scale per row (bertjax/compression/quantize.py);
params.npz then holds kernel/qvalue and kernel/scale in place of each kernel, embedding/qrows and
embedding/row_scale in place of each table, and config.json says "quantize". bertjax.load reads it back
as int8. --quantize=int4-gG or int8-gG (int4-g128, int4-g32, int8-g128): a scale per group of G input
elements per output channel (Q-BERT's group-wise quantisation), int4 stored two values a byte as
kernel/qpacked; the tables int8 per row as above. --quantize=mixed --size_budget=B --dev=FILE (a fine-tuned
model and its task's dev file): int4-g128 or int8-g128 per encoder layer, int8 going to the layers whose
int4 alone costs the most dev score while the dense kernels stay within B x their float32 bytes
(bertjax/runs/precision_plan.py); config.json records each layer's mode and measured drop.
Every export also writes a README.md model card (bertjax/interop/model_card.py). The export is written
to a temporary directory beside --to and renamed into place, so an interrupted export leaves nothing
half-written; an existing non-empty --to is refused unless --overwrite.
"""

from absl import flags

from bertjax.runs import console, exporting


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        source=flags.DEFINE_string("from", None,
                                   "A bertjax workdir (pretraining or fine-tuning) or checkpoint directory."),
        to=flags.DEFINE_string("to", None, "The directory to write (refused if it exists and is not empty)."),
        format=flags.DEFINE_string("format", "hf", f"One of {', '.join(exporting.FORMATS)}."),
        step=flags.DEFINE_integer("step", None, "This step of the workdir's checkpoints/ (default: the newest; "
                                  "a fine-tuning workdir: its best dev checkpoint)."),
        overwrite=flags.DEFINE_bool("overwrite", False, "Replace a non-empty --to."),
        max_seq_length=flags.DEFINE_integer("max_seq_length", None, "savedmodel: the fixed length texts are padded "
                                            "or cut to inside the graph (default: a fine-tuned model's own, "
                                            "else 128)."),
        hf_class=flags.DEFINE_enum("hf_class", "pretraining", ["pretraining", "masked_lm"],
                                   "hf, a pretraining checkpoint: BertForPreTraining's weights (the pooler and NSP "
                                   "head kept), or BertForMaskedLM's alone (fill-mask loads it with nothing unused); "
                                   "the other families' classes alike."),
        quantize=flags.DEFINE_string("quantize", None, "params, savedmodel: int8 (or int8-weights, int8-dynamic) "
                                     "stores every dense layer's kernel as int8 with per-channel scales; int4-g128 "
                                     "(int4-gG, int8-gG) as int4 or int8 with a scale per G inputs; mixed: "
                                     "int4 or int8 per layer, chosen on --dev within --size_budget."),
        size_budget=flags.DEFINE_float("size_budget", None, "--quantize=mixed: the dense kernels' bytes as a share "
                                       "of their float32 bytes (int4-g128 everywhere is about 0.13, int8 0.25)."),
        dev=flags.DEFINE_string("dev", None, "--quantize=mixed: the fine-tuned task's dev file whose score measures "
                                "each layer's sensitivity."),
    )


def main(argv, args):
    console.no_arguments(argv)
    out = console.finish(exporting.export, args.source, args.to, args.format, step=args.step,
                         overwrite=args.overwrite, max_seq_length=args.max_seq_length, hf_class=args.hf_class,
                         quantize=args.quantize, size_budget=args.size_budget, dev=args.dev)
    print(f"exported {args.source} as {args.format} to {out}")
    if args.format == "savedmodel":
        print(f"load it with `import tensorflow as tf, tensorflow_text` and then tf.saved_model.load('{out}'): "
              "tensorflow_text registers the tokenizer's ops (without it: Op type not registered 'NormalizeUTF8')")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
