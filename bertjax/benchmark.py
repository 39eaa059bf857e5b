"""python -m bertjax.benchmark: tokens/s of the full training step, beside Hugging Face on the same shapes.

    python -m bertjax.benchmark                                   # CPU: mini, small, base at 32 x 128, vs HF
    python -m bertjax.benchmark --sizes=base --steps=5 --no_torch # bertjax alone
    python -m bertjax.benchmark --sizes=roberta_base,albert_base,modernbert_base  # the families, vs HF
    python -m bertjax.benchmark --sizes=tiny,mini --packing       # packed rows against padded ones
    python -m bertjax.benchmark --accelerator                     # GPU/TPU: base and large, bf16, vs HF
    python -m bertjax.benchmark --accelerator --profile=/tmp/prof # and a trace, kernel time by category
    python -m bertjax.benchmark --embeddings                      # embed and contrastive steps vs sentence-transformers
    python -m bertjax.benchmark --long_rows=2048,8192              # one packed row: xla vs blockwise attention
    python -m bertjax.benchmark --mining=100000,1000000            # hard-negative mining at two corpus sizes
    python -m bertjax.benchmark --sparse_search=100000,1000000     # the SPLADE inverted index at two sizes
    python -m bertjax.benchmark --student_speed=tiny,base         # BiLSTM-soft's forward against BERT's
    python -m bertjax.benchmark --sizes=base --json=rows.jsonl     # each row also as JSON, as it is measured
    python -m bertjax.benchmark --accelerator --hlo=step.hlo.txt  # and the compiled step as optimized HLO

What is timed is the whole optimizer step as the trainer runs it (training.step.train_step: forward, backward,
the config's clipping and optimizer, BERT's AdamW for BERT; state donated), built by pretraining_step.setup from
configs/<size>.py on a one-device mesh, on synthetic full-length batches. Every pretraining config under
configs/ is a size (BERT's and the RoBERTa, ALBERT and ModernBERT ones), all at the benchmark's
vocabulary (BERT's 30,522) and shapes (BERT's 15% of predictions, for ModernBERT's 30% too). The
platform's defaults apply (config.PLATFORM_DEFAULTS: bf16 and cuDNN attention on GPUs, float32 and XLA
attention on CPUs) unless --dtype or --model_overrides say otherwise. The Hugging Face class the config
converts to (BertForPreTraining, RobertaForMaskedLM, AlbertForPreTraining, ModernBertForMaskedLM) runs
the same batches in PyTorch: on the CPU eager in float32; on a GPU eager and torch.compile'd, with sdpa
attention, bf16 autocast, fused AdamW and clipping 1.0. Printed: tokens/s, model TFLOP/s and MFU, the
step's memory (bertjax: the compiled step's memory_analysis(); HF: torch's peak allocation) and bertjax's
ratio to each HF variant.
--embeddings times sentence embeddings and the contrastive training step instead, beside
sentence-transformers on one model of MiniLM-L6's shape (--model.KEY=VALUE changes it) and the same
texts (bertjax/bench/embedding_speed.py says what is timed); an accelerator run (--accelerator) adds
these figures after its step table unless --noembeddings. docs/performance.md records the figures. No
TensorFlow is imported on the step benchmark's path (the embedding figures tokenize with bertjax's
tokenizer, which is TensorFlow ops).
--long_rows times the step on packed rows of each given length (default modernbert_tiny, one row) under
each of --attention_impls, each in a fresh process: tokens/s, the compiled step's temporaries and the
process's peak resident memory, to show what attention without an [S, S] matrix buys on long rows.
--mining times hard-negative mining (search and selection) on synthetic embeddings at each corpus size,
each in a fresh process: seconds, queries/s and peak resident memory (bertjax/bench/mining_speed.py).
--sparse_search builds and searches the sparse (SPLADE) inverted index of synthetic Zipf-like vectors at
each corpus size, each in a fresh process: build seconds, index size, queries/s and resident memory
(bertjax/bench/sparse_search_speed.py).
--student_speed times the forward (logits to the host) of BERT classifiers of the given sizes and of the
BiLSTM-soft student in its sentence and pair forms, randomly initialised, on the same rows at batch 1 and 32,
taking turns as the compression report does: milliseconds and the student's speed-up over each BERT
(bertjax/bench/student_speed.py).
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

import configs.base
from bertjax.bench import mining_speed, sparse_search_speed, step_speed, student_speed
from bertjax.runs import console


def define_flags(argv: list[str]) -> dict:
    """The flags, defined when the program is entered: importing it defines none."""
    return {**_step_flags(argv), **_embedding_flags(), **_long_row_flags(), **_mining_flags(), **_sparse_search_flags(),
            **_student_flags(), **_output_flags()}


def _step_flags(argv: list[str]) -> dict:
    """What the step benchmark times (sizes, shapes, model overrides) and what it is timed beside."""
    return dict(
        sizes=flags.DEFINE_list("sizes", None, "Model configs (configs/<size>.py: tiny ... large, roberta_base, "
                                "albert_tiny, modernbert_large, ...). Default: mini,small,base on the CPU, "
                                "base,large with --accelerator."),
        batch=flags.DEFINE_integer("batch_size", 32, "Sequences per step (CPU mode; with --accelerator it replaces "
                                   "the default shapes when given)."),
        seq=flags.DEFINE_integer("seq_len", 128, "Tokens per sequence (CPU mode; with --accelerator it replaces the "
                                 "default shapes when given)."),
        steps=flags.DEFINE_integer("steps", 10, "Timed steps per measurement."),
        warmup=flags.DEFINE_integer("warmup", 3, "Untimed steps first (the first one compiles)."),
        dtype=flags.DEFINE_string("dtype", None, "Compute dtype of bertjax (default: the platform's, float32 on "
                                  "the CPU, bfloat16 on accelerators)."),
        no_torch=flags.DEFINE_bool("no_torch", False, "Time bertjax only (no PyTorch import)."),
        no_compile=flags.DEFINE_bool("no_torch_compile", False, "On a GPU, skip the torch.compile variant of HF."),
        accelerator=flags.DEFINE_bool("accelerator", None, "Accelerator mode: base and large, bf16, MFU. Default: on "
                                      "when jax.default_backend() is not 'cpu'."),
        # --model.scan_layers=false --model.remat_policy=full: ml_collections types and checks each value
        # against the model section (--model_overrides=scan_layers=false,remat_policy=full says the same).
        model=config_flags.DEFINE_config_dict("model", configs.base.get_config().model, "Overrides of the model "
                                              "config, e.g. --model.scan_layers=false (for performance "
                                              "investigations).", sys_argv=argv),
        overrides=flags.DEFINE_list("model_overrides", [], "key=value pairs for the model config, e.g. "
                                    "scan_layers=false,remat_policy=full: the same as --model.KEY=VALUE."),
        dropout_rng=flags.DEFINE_string("dropout_rng", "threefry", "train.dropout_rng: threefry | rbg."),
        profile=flags.DEFINE_string("profile", None, "Write a jax.profiler trace of a few bertjax steps under this "
                                    "directory and print the device time per step by kernel category."),
        packing=flags.DEFINE_bool("packing", False, "Time bertjax on packed rows against rows of one padded "
                                  "example each, both of the demo corpus's example lengths: real tokens/s."),
    )


def _embedding_flags() -> dict:
    """--embeddings: sentence embeddings and the contrastive step beside sentence-transformers."""
    return dict(
        embeddings=flags.DEFINE_bool("embeddings", None, "Sentence embeddings (bertjax.load(...).embed against "
                                     "SentenceTransformer.encode) and the contrastive training step (MNRL) beside "
                                     "sentence-transformers, on one MiniLM-L6-shaped model. Default: off on the "
                                     "CPU, after the step table with --accelerator."),
        texts=flags.DEFINE_integer("texts", 2048, "--embeddings: demo-corpus texts embedded (2 words to past "
                                   "--max_length tokens)."),
        max_length=flags.DEFINE_integer("max_length", 256, "--embeddings: tokens per text in embedding "
                                        "(all-MiniLM-L6-v2's max_seq_length)."),
        embed_passes=flags.DEFINE_integer("embed_passes", 3, "--embeddings: timed passes over the texts per side, "
                                          "alternated (the median counts), after one untimed pass."),
    )


def _long_row_flags() -> dict:
    """--long_rows: the step on long packed rows under each attention implementation."""
    return dict(
        long_rows=flags.DEFINE_list("long_rows", [], "Sequence lengths (e.g. 2048,4096,8192): time the step on "
                                    "packed rows of each, one row unless --batch_size is given, under each of "
                                    "--attention_impls, each in a fresh process (peak RSS, temporaries, tokens/s)."),
        attention_impls=flags.DEFINE_list("attention_impls", ["xla", "blockwise"], "--long_rows: the "
                                          "model.attention_impl values compared (attention dropout off for all)."),
        long_row_timeout=flags.DEFINE_float("long_row_timeout", 1200.0, "--long_rows: seconds one measurement may "
                                            "take before it is reported as not done."),
    )


def _mining_flags() -> dict:
    """--mining: hard-negative mining at each corpus size, in place of everything else."""
    return dict(
        mining=flags.DEFINE_list("mining", [], "Corpus sizes (e.g. 100000,1000000): time mining hard negatives "
                                 "(the search and the selection) on synthetic embeddings at each, in a fresh process "
                                 "(seconds, queries/s, peak RSS); nothing else runs."),
        mining_queries=flags.DEFINE_integer("mining_queries", mining_speed.QUERIES, "--mining: queries mined."),
        mining_dim=flags.DEFINE_integer("mining_dim", mining_speed.DIM, "--mining: the embeddings' width "
                                        "(all-MiniLM-L6-v2's)."),
    )


def _sparse_search_flags() -> dict:
    """--sparse_search: the sparse inverted index at each corpus size, in place of everything else."""
    return dict(
        sparse_search=flags.DEFINE_list("sparse_search", [], "Corpus sizes (e.g. 100000,1000000): build and search "
                                        "the sparse (SPLADE) inverted index of synthetic Zipf-like vectors at each, "
                                        "in a fresh process (build seconds, index MiB, queries/s, resident "
                                        "memory); nothing else runs."),
        sparse_queries=flags.DEFINE_integer("sparse_queries", sparse_search_speed.QUERIES, "--sparse_search: "
                                            "queries searched (k=10)."),
    )


def _student_flags() -> dict:
    """--student_speed: BiLSTM-soft's forward against BERT classifiers, in place of everything else."""
    return dict(
        student_speed=flags.DEFINE_list("student_speed", [], "BERT sizes (e.g. tiny,base): time the forward of a "
                                        "BERT classifier of each and of the BiLSTM-soft student (sentence and pair "
                                        "forms) at batch 1 and 32, taking turns; print ms and the student's "
                                        "speed-ups; nothing else runs."),
        student_seq_length=flags.DEFINE_integer("student_seq_length", student_speed.SEQ_LENGTH, "--student_speed: "
                                                "tokens per row."),
        student_repeats=flags.DEFINE_integer("student_repeats", student_speed.REPEATS, "--student_speed: timed "
                                             "calls per model and batch size (the median counts), after "
                                             f"{student_speed.WARMUP} untimed ones."),
    )


def _output_flags() -> dict:
    """What is written besides the printed tables, or in their place."""
    return dict(
        memory_only=flags.DEFINE_bool("memory_only", False, "Compile bertjax's step and print its memory; run nothing "
                                       "(e.g. to choose a remat policy for a GPU on a CPU machine)."),
        json=flags.DEFINE_string("json", None, "Also append each measured row (the step's, --packing's, --long_rows') "
                                 "to this JSON-lines file as soon as it is measured, so that a run cut off still "
                                 "reports: tps (tokens/s), mfu, ms (per step), memory (bytes), ratios, and the run's "
                                 "overrides, XLA_FLAGS and device."),
        json_label=flags.DEFINE_string("json_label", None, "--json: a name written into each row (e.g. the part of "
                                       "launch/gpu_check.py that ran it)."),
        hlo=flags.DEFINE_string("hlo", None, "Write bertjax's compiled step to this file as optimized HLO text "
                                "(the layouts around the attention kernel, readable on any machine); with several "
                                "sizes or shapes the last one's."),
    )


def with_model_overrides(argv: list[str]) -> list[str]:
    """argv with --model_overrides=a=1,b=2 spelt as ml_collections' own --model.a=1 --model.b=2, which then
    types and checks each value against the model section."""
    out = []
    for arg in argv:
        name, _, value = arg.partition("=")
        if name not in ("--model_overrides", "-model_overrides"):
            out.append(arg)
            continue
        for pair in filter(None, (p.strip() for p in value.split(","))):
            if "=" not in pair:
                console.fail(f"--model_overrides entry {pair!r} is not key=value")
            out.append(f"--model.{pair}")
    return out


def main(argv, args):
    console.no_arguments(argv)
    if args.mining:
        try:
            passages = [int(n) for n in args.mining]
        except ValueError:
            console.fail(f"--mining={','.join(args.mining)}: give corpus sizes as whole numbers, e.g. 100000,1000000")
        console.finish(mining_speed.benchmark, passages, num_queries=args.mining_queries, dim=args.mining_dim)
        return
    if args.sparse_search:
        try:
            documents = [int(n) for n in args.sparse_search]
        except ValueError:
            console.fail(f"--sparse_search={','.join(args.sparse_search)}: give corpus sizes as whole numbers, e.g. "
                         f"100000,1000000")
        console.finish(sparse_search_speed.in_fresh_processes, documents, args.sparse_queries)
        return
    if args.student_speed:
        console.finish(student_speed.benchmark, args.student_speed, seq_length=args.student_seq_length,
                       repeats=args.student_repeats)
        return
    console.finish(step_speed.benchmark, sizes=args.sizes, seq_len=args.seq, batch_size=args.batch,
                   shape_given=flags.FLAGS["seq_len"].present or flags.FLAGS["batch_size"].present,
                   steps=args.steps, warmup=args.warmup, dtype=args.dtype,
                   overrides=config_flags.get_override_values(flags.FLAGS["model"]), dropout_rng=args.dropout_rng,
                   accelerator=args.accelerator, no_torch=args.no_torch, no_torch_compile=args.no_compile,
                   profile=args.profile, packing=args.packing, memory_only=args.memory_only,
                   embeddings=args.embeddings, texts=args.texts, max_length=args.max_length,
                   embed_passes=args.embed_passes, long_rows=[int(n) for n in args.long_rows],
                   attention_impls=args.attention_impls, long_row_timeout=args.long_row_timeout,
                   json_path=args.json, json_label=args.json_label, hlo_path=args.hlo)


def entry():
    # On a GPU the HF peers train in this process beside JAX, which then takes device memory as it needs
    # it instead of three quarters of it at its start.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    argv = with_model_overrides(sys.argv)
    try:
        defined = define_flags(argv)  # the model overrides are checked here, against the model section
    except (AttributeError, KeyError) as e:
        while e.args and isinstance(e.args[0], BaseException):  # AttributeError(KeyError("'key'\nDid you..."))
            e = e.args[0]
        detail = "; ".join(line.strip("'\" ") for line in str(e.args[0] if e.args else e).splitlines())
        console.fail(f"unknown model config key in {' '.join(a for a in argv if a.startswith('--model.'))}: {detail}")
    console.run_program(main, lambda: defined, argv=argv)


if __name__ == "__main__":
    entry()
