"""python -m bertjax.export: a checkpoint handed to the tools everyone else uses.

    python -m bertjax.export --from=runs/tiny --to=exports/tiny-hf --format=hf
    python -m bertjax.export --from=runs/tiny --step=400 --to=exports/tiny-serving --format=savedmodel
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-params --format=params
    python -m bertjax.export --from=runs/sst2 --to=exports/sst2-int8 --format=params --quantize=int8

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
--quantize=int8 (params, savedmodel): every dense layer's kernel stored as int8 with a float32 scale per
output channel, every embedding table as int8 with a scale per row (bertjax/compression/quantize.py);
params.npz then holds kernel/qvalue and kernel/scale in place of each kernel, embedding/qrows and
embedding/row_scale in place of each table, and config.json says "quantize". bertjax.load reads it back
as int8.
Every export also writes a README.md model card (bertjax/interop/model_card.py). The export is written
to a temporary directory beside --to and renamed into place, so an interrupted export leaves nothing
half-written; an existing non-empty --to is refused unless --overwrite.
"""

import json
import os
import shutil
import sys

import numpy as np
from absl import app, flags

from bertjax.runs import console

FORMATS = ("hf", "savedmodel", "params")


def define_flags() -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return dict(
        source=flags.DEFINE_string("from", None, "A bertjax workdir (pretraining or fine-tuning) or checkpoint directory."),
        to=flags.DEFINE_string("to", None, "The directory to write (refused if it exists and is not empty)."),
        format=flags.DEFINE_string("format", "hf", f"One of {', '.join(FORMATS)}."),
        step=flags.DEFINE_integer("step", None, "This step of the workdir's checkpoints/ (default: the newest; "
                                  "a fine-tuning workdir: its best dev checkpoint)."),
        overwrite=flags.DEFINE_bool("overwrite", False, "Replace a non-empty --to."),
        max_seq_length=flags.DEFINE_integer("max_seq_length", None, "savedmodel: the fixed length texts are padded "
                                            "or cut to inside the graph (default: a fine-tuned model's own, else 128)."),
        hf_class=flags.DEFINE_enum("hf_class", "pretraining", ["pretraining", "masked_lm"],
                                   "hf, a pretraining checkpoint: BertForPreTraining's weights (the pooler and NSP "
                                   "head kept), or BertForMaskedLM's alone (fill-mask loads it with nothing unused); "
                                   "the other families' classes alike."),
        quantize=flags.DEFINE_string("quantize", None, "params, savedmodel: int8 (or int8-weights, int8-dynamic) "
                                     "stores every dense layer's kernel as int8 with per-channel scales."),
    )


# ----------------------------------------------------------------------------------------------------
# The checkpoint to export
# ----------------------------------------------------------------------------------------------------


def checkpoint_to_export(path: str, step: int | None) -> str:
    """The checkpoint directory --from and --step name; one line for each way that can be wrong."""
    from etils import epath

    from bertjax.interop import pretrained
    from bertjax.training import checkpoint

    p = epath.Path(path)
    if not p.exists():
        raise ValueError(f"--from={path} does not exist")
    if step is None:
        chosen = pretrained.model_checkpoint(path)
        if chosen is None:
            raise ValueError(f"--from={path} has no checkpoint (an empty workdir, or one whose first save did not "
                             "finish): train it further, or point --from at a workdir with checkpoints/")
        return chosen
    if not checkpoint.is_checkpoint(path):
        raise ValueError(f"--from={path} has no checkpoints: --step needs a workdir with checkpoints/")
    directory, _ = checkpoint.find_checkpoint(path)
    steps = sorted(int(c.name) for c in epath.Path(directory).iterdir() if c.name.isdigit())
    if step not in steps:
        raise ValueError(f"--step={step}: {path} has checkpoints at steps {', '.join(map(str, steps))}")
    return str(epath.Path(directory) / str(step))


# ----------------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------------


def _plain(params) -> dict:
    import jax

    return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params)


def write_hf(bert, directory: str, hf_class: str = "pretraining") -> None:
    from bertjax.interop import hf

    vocab, lower_case = _vocabulary_file(bert), bool(bert.tokenizer.lower_case)
    params = _plain(bert.params)
    if bert.task is None:  # the family's pretraining class (hf.family_of_config), or its masked-LM class
        hf.save_hf_checkpoint(directory, bert.config, params, vocab_path=vocab, lower_case=lower_case,
                              masked_lm_only=hf_class == "masked_lm")
    else:
        if bert.task.get("feature_based"):
            raise ValueError("the feature-based tagger (a BiLSTM on frozen features) has no Hugging Face class: "
                             "export it with --format=params")
        labels = list(bert.task.get("labels") or []) or None
        # The family's task class: BertForSequenceClassification, ModernBertForTokenClassification, ...
        hf.save_hf_head(directory, bert.config, params, bert.task["kind"], label_names=labels, vocab_path=vocab,
                        lower_case=lower_case)
    _write_tokenizer_files(bert, directory)


def _vocabulary_file(bert) -> str | None:
    """The WordPiece vocab.txt (a SentencePiece model is written as tokenizer.json instead)."""
    return bert.vocab_path if bert.tokenizer.kind == "wordpiece" else None


def _write_tokenizer_files(bert, directory: str) -> None:
    """special_tokens_map.json, and for SentencePiece the tokenizers-library tokenizer.json with the same ids."""
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]"}
    with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    if bert.tokenizer.kind == "sentencepiece":
        from bertjax.interop import hf_files, hf_tokenizer

        hf_tokenizer.write_sentencepiece_tokenizer(bert.tokenizer, bert.vocab_path, directory,
                                                   model_max_length=bert.config.max_position_embeddings,
                                                   model_input_names=hf_files.model_input_names(bert.config))


def write_params(bert, directory: str, meta: dict) -> None:
    from flax import traverse_util

    flat = traverse_util.flatten_dict(_plain(bert.params), sep="/")
    np.savez(os.path.join(directory, "params.npz"), **flat)
    config = {"model": meta["model"], "tokenizer": dict(meta.get("tokenizer") or {}), "task": meta.get("task"),
              "step": meta.get("step")}
    if bert.quantize:  # int8 kernels (qvalue, scale) one per layer (unrolled), int8 tables (qrows, row_scale)
        config["model"] = {**meta["model"], "scan_layers": False}
        config["quantize"] = bert.quantize
    if bert.vocab_path:
        name = os.path.basename(bert.vocab_path)
        shutil.copyfile(bert.vocab_path, os.path.join(directory, name))
        config["tokenizer"]["path"] = name
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def write_savedmodel(bert, directory: str, max_seq_length: int | None) -> None:
    from bertjax.interop import savedmodel

    savedmodel.export_savedmodel(bert, directory, max_seq_length=max_seq_length)


# ----------------------------------------------------------------------------------------------------
# The program
# ----------------------------------------------------------------------------------------------------


def export(source: str, to: str, export_format: str, *, step: int | None = None, overwrite: bool = False,
           max_seq_length: int | None = None, hf_class: str = "pretraining", quantize: str | None = None) -> str:
    """Writes the export; returns its directory. A temporary directory beside `to` is renamed into place
    at the end, so nothing is half-written if anything fails."""
    import bertjax
    from bertjax.training import checkpoint
    from bertjax.interop import model_card

    if export_format not in FORMATS:
        raise ValueError(f"--format={export_format}: choose one of {', '.join(FORMATS)}")
    if not source or not to:
        raise ValueError("--from and --to are required")
    if quantize and export_format == "hf":
        raise ValueError("--format=hf --quantize: transformers reads no int8 BERT format without extra packages "
                         "(its int8 loaders need bitsandbytes, quanto, torchao or compressed-tensors); export "
                         "int8 as --format=params or --format=savedmodel, or hf without --quantize")
    to = os.path.abspath(to)
    if os.path.exists(to) and (not os.path.isdir(to) or os.listdir(to)) and not overwrite:
        raise ValueError(f"--to={to} exists and is not empty: choose a new directory, or pass --overwrite")
    chosen = checkpoint_to_export(source, step)
    bert = bertjax.load(chosen, quantize=quantize)
    _, meta = checkpoint.restore_params(chosen)
    if step is not None and meta.get("step") != step:
        raise ValueError(f"--step={step}: that checkpoint is unreadable (the newest readable one is step "
                         f"{meta.get('step')}); export that step or another")
    temporary = f"{to}.export-tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    try:
        if export_format == "hf":
            write_hf(bert, temporary, hf_class)
        elif export_format == "params":
            write_params(bert, temporary, meta)
        else:
            write_savedmodel(bert, temporary, max_seq_length)
        card = model_card.model_card(workdir=checkpoint.workdir_of(chosen), meta=meta, params=bert.params,
                                     export_format=export_format, path_hint=to)
        if bert.quantize:
            card += (f"\nQuantised: every dense layer's kernel is int8 with a float32 scale per output channel "
                     f"({bert.quantize}, bertjax/compression/quantize.py); bertjax.load reads it as such.\n")
        with open(os.path.join(temporary, "README.md"), "w") as f:
            f.write(card)
        if os.path.exists(to):
            old = f"{to}.export-old-{os.getpid()}"
            os.rename(to, old)
            os.rename(temporary, to)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.makedirs(os.path.dirname(to) or ".", exist_ok=True)
            os.rename(temporary, to)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return to


def main(argv, args):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    console.quiet_library_logs()
    try:
        out = export(args.source, args.to, args.format, step=args.step, overwrite=args.overwrite,
                     max_seq_length=args.max_seq_length, hf_class=args.hf_class, quantize=args.quantize)
    except (ValueError, FileNotFoundError, OSError) as e:
        console.fail(str(e))
    except KeyboardInterrupt:
        print("Ctrl-C: stopped; nothing was written", file=sys.stderr)
        sys.exit(130)
    print(f"exported {args.source} as {args.format} to {out}")
    if args.format == "savedmodel":
        print(f"load it with `import tensorflow as tf, tensorflow_text` and then tf.saved_model.load('{out}'): "
              "tensorflow_text registers the tokenizer's ops (without it: Op type not registered 'NormalizeUTF8')")


def entry():
    console.run_program(main, define_flags)


if __name__ == "__main__":
    entry()
