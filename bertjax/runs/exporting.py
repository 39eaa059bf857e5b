"""Exports of a checkpoint to the tools everyone else uses: Hugging Face directories of the model's
family (pretraining, masked-LM or the task's class), sentence-transformers directories (a
SentenceTransformer, SparseEncoder or MultiVectorEncoder as the embedding record says, or a CrossEncoder for
a text-pair classifier), TensorFlow SavedModels, params.npz, each with a model card; what
`python -m bertjax.export` runs (its docstring lists the formats). A BiLSTM student of task distillation
(bertjax/models/bilstm.py) exports as params.npz alone, its record in config.json's distill section."""

import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
from etils import epath
from flax import traverse_util

from bertjax import embeddings, inference
from bertjax.compression import quantize as quantization  # `quantize` is export's argument
from bertjax.interop import (hf, hf_electra, hf_files, hf_tokenizer, model_card, multivector_export, savedmodel,
                             sentence_transformers)
from bertjax.runs import precision_plan
from bertjax.runs.console import say
from bertjax.tasks import registry
from bertjax.text import templates
from bertjax.models import bert as bert_model
from bertjax.models import bilstm, multivector
from bertjax.models.config import BertConfig, fields_of
from bertjax.training import checkpoint, saved_models
from bertjax.training.checkpoint_meta import CheckpointMeta

FORMATS = ("hf", "savedmodel", "params", "sentence-transformers")


def checkpoint_to_export(path: str, step: int | None) -> str:
    """The checkpoint directory --from and --step name; one line for each way that can be wrong."""
    p = epath.Path(path)
    if not p.exists():
        raise ValueError(f"--from={path} does not exist")
    if step is None:
        chosen = saved_models.chosen_checkpoint(path)
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
    return jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x)), params)


def write_hf(bert, directory: str, hf_class: str = "pretraining") -> None:
    vocab, lower_case = _vocabulary_file(bert), bool(bert.tokenizer.lower_case)
    # "dense" is a sentence embedder's (no Hugging Face class has it): the sentence-transformers export writes it.
    params = {name: tree for name, tree in _plain(bert.params).items() if name != "dense"}
    if bert.task is None:  # the family's pretraining class (hf.family_of_config), or its masked-LM class
        hf.save_hf_checkpoint(directory, bert.config, params, vocab_path=vocab, lower_case=lower_case,
                              masked_lm_only=hf_class == "masked_lm")
    else:
        if bert.task.feature_based:
            raise ValueError("the feature-based tagger (a BiLSTM on frozen features) has no Hugging Face class: "
                             "export it with --format=params")
        labels = list(bert.task.labels or []) or None
        # The family's task class: BertForSequenceClassification, ModernBertForTokenClassification, ...
        hf.save_hf_head(directory, bert.config, params, bert.task.kind, label_names=labels, vocab_path=vocab,
                        lower_case=lower_case)
    _write_tokenizer_files(bert, directory)


def write_electra_pair(bert, directory: str, meta: CheckpointMeta, params) -> None:
    """An ELECTRA run: discriminator/ (ElectraForPreTraining) and generator/ (ElectraForMaskedLM), each with
    the tokenizer files (train.init_from reads the pair back)."""
    generator = BertConfig.from_dict({**meta.electra["model"], **fields_of(bert.config, "compute")})
    vocab, lower_case = _vocabulary_file(bert), bool(bert.tokenizer.lower_case)
    for sub in hf_electra.save_pair(directory, bert.config, generator, _plain(params), vocab_path=vocab,
                                    lower_case=lower_case):
        _write_tokenizer_files(bert, str(sub))


def _vocabulary_file(bert) -> str | None:
    """The WordPiece vocab.txt (a SentencePiece model is written as tokenizer.json instead)."""
    return bert.vocab_path if bert.tokenizer.kind == "wordpiece" else None


def _write_tokenizer_files(bert, directory: str) -> None:
    """special_tokens_map.json; for SentencePiece the tokenizers-library tokenizer.json with the same ids, for
    byte-level BPE its own tokenizer.json and a tokenizer_config.json naming its special tokens."""
    tok = bert.tokenizer
    special = {f"{role}_token": token for role, token in zip(templates.SPECIAL_ROLES, tok.special_tokens)}
    with open(os.path.join(directory, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
    if tok.kind == "sentencepiece":
        hf_tokenizer.write_sentencepiece_tokenizer(tok, bert.vocab_path, directory,
                                                   model_max_length=bert.config.max_position_embeddings,
                                                   model_input_names=hf_files.model_input_names(bert.config))
    elif tok.kind == "bpe":
        shutil.copyfile(bert.vocab_path, os.path.join(directory, "tokenizer.json"))
        config = bert.config
        # PreTrainedTokenizerFast runs the tokenizer.json as it is, whatever the family's own class would add.
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
                    "model_max_length": config.max_position_embeddings - config.position_offset,
                    "model_input_names": hf_files.model_input_names(config)}
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(settings, f, indent=2)


def write_sentence_transformers(bert, directory: str) -> None:
    """A SentenceTransformer directory (the family's encoder class as Hugging Face's AutoModel loads it,
    then the embedder's modules as its embedding record says, or mean pooling where it has none); a
    fine-tuned classifier, regression or reranker of text pairs as a CrossEncoder directory."""
    if bert.task is not None and bert.task.kind != registry.CONTRASTIVE:  # an embedder's task is its training
        _check_cross_encoder(bert.task)
        write_hf(bert, directory)
        sentence_transformers.write_cross_encoder(directory)
        return
    if embeddings.representation(bert.embedding)[0] == embeddings.SPLADE:
        write_sparse_encoder(bert, directory)
        return
    if embeddings.representation(bert.embedding)[0] == embeddings.COLBERT:
        write_multivector_encoder(bert, directory)
        return
    record = bert.embedding or embeddings.DEFAULT
    params = {name: tree for name, tree in _plain(bert.params).items() if name != "dense"}
    hf.save_hf_encoder(directory, bert.config, params, vocab_path=_vocabulary_file(bert),
                       lower_case=bool(bert.tokenizer.lower_case))
    _write_tokenizer_files(bert, directory)
    config = bert.config
    limit = config.max_position_embeddings - config.position_offset
    dense = _plain(bert.params["dense"]) if record.dense is not None else None
    # A WordPiece or SentencePiece tokenizer lower-cases in its tokenizer.json; BPE's is cased, and a
    # lower-casing module says so to sentence-transformers.
    lowers = bert.tokenizer.kind == "bpe" and bert.tokenizer.lower_case
    sentence_transformers.write_embedder(directory, record, dense, config.hidden_size,
                                         min(record.max_seq_length or limit, limit), do_lower_case=lowers)


def write_sparse_encoder(bert, directory: str) -> None:
    """A SparseEncoder directory of a SPLADE model: the family's masked-LM class with the tokenizer (at the
    root, or the inference-free Router's document side), then sentence_transformers.write_sparse_encoder's
    modules (its static query table where it has one)."""
    static = bert.params.get("static_query")
    if static is not None and bert.tokenizer.vocab_size != bert.config.vocab_size:
        raise ValueError(f"--format=sentence-transformers: the model's vocabulary has {bert.config.vocab_size} rows "
                         f"and its tokenizer {bert.tokenizer.vocab_size} tokens, and SparseStaticEmbedding's table "
                         "is the tokenizer's size: export it with --format=params")
    folder = os.path.join(directory, sentence_transformers.DOCUMENT_TRANSFORMER if static is not None else "")
    os.makedirs(folder, exist_ok=True)
    # The pretraining class's params, zeros standing in for the NSP head SPLADE has not: the masked-LM class
    # written leaves it out.
    shapes = jax.eval_shape(lambda: bert_model.BertForPreTraining(bert.config).init(
        jax.random.key(0), **bert_model.dummy_batch(1, 2, 1)))["params"]
    nsp = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), nn.unbox(shapes["nsp_head"]))
    params = {**_plain({k: bert.params[k] for k in ("bert", "mlm_head")}), "nsp_head": nsp}
    hf.save_hf_checkpoint(folder, bert.config, params, vocab_path=_vocabulary_file(bert),
                          lower_case=bool(bert.tokenizer.lower_case), masked_lm_only=True)
    _write_tokenizer_files(bert, folder)
    limit = bert.config.max_position_embeddings - bert.config.position_offset
    record = bert.embedding or embeddings.DEFAULT
    sentence_transformers.write_sparse_encoder(
        directory, record, bert.config.vocab_size, min(record.max_seq_length or limit, limit),
        static_weight=None if static is None else _plain(static)["weight"],
        do_lower_case=bert.tokenizer.kind == "bpe" and bert.tokenizer.lower_case)


def write_multivector_encoder(bert, directory: str) -> None:
    """A MultiVectorEncoder directory of a ColBERT model: the family's encoder class with the tokenizer, then
    multivector_export.write_modules' (the projection, the texts' settings from its embedding record)."""
    limit = bert.config.max_position_embeddings - bert.config.position_offset
    texts, _, _ = embeddings.multivector_settings(bert.embedding, limit, None)
    params = _plain({name: bert.params[name] for name in ("bert", multivector.PROJECTION)})
    hf.save_hf_encoder(directory, bert.config, {"bert": params["bert"]}, vocab_path=_vocabulary_file(bert),
                       lower_case=bool(bert.tokenizer.lower_case))
    _write_tokenizer_files(bert, directory)
    multivector_export.write_modules(directory, params[multivector.PROJECTION]["kernel"], texts,
                                     do_lower_case=bert.tokenizer.kind == "bpe" and bert.tokenizer.lower_case)


def _check_cross_encoder(task) -> None:
    """A fine-tuned model exports as a CrossEncoder where it scores text pairs: one line otherwise."""
    if task.kind not in ("classification", "regression", "rerank") or task.feature_based:
        raise ValueError(f"--format=sentence-transformers: a fine-tuned {task.kind} model is no SentenceTransformer "
                         "nor CrossEncoder (a classifier, regression or reranker of text pairs is); export it with "
                         "--format=hf")
    known = registry.TASKS.get(task.name)
    if known is not None and len(known.text_features) == 1:
        raise ValueError(f"--format=sentence-transformers: {task.name} classifies single sentences, and a CrossEncoder "
                         "scores text pairs; export it with --format=hf")


def write_params(bert, directory: str, meta: CheckpointMeta, precision: dict | None = None) -> None:
    flat = traverse_util.flatten_dict(_plain(bert.params), sep="/")
    np.savez(os.path.join(directory, "params.npz"), **flat)
    student = bilstm.from_record(meta.distill) is not None  # its record says what the params are
    record = CheckpointMeta(meta.step, meta.model, tokenizer=meta.tokenizer, task=meta.task,
                            embedding=meta.embedding, distill=meta.distill if student else None).to_json()
    config = {"task": None, **record, "tokenizer": dict(record.get("tokenizer") or {})}
    if bert.quantize:  # kernels (qvalue or qpacked, scale) one per layer (unrolled), int8 tables (qrows, row_scale)
        config["model"] = {**meta.model, "scan_layers": False}
        config["quantize"] = bert.quantize
    if precision:  # --quantize=mixed: each layer's mode and measured sensitivity (bertjax/runs/precision_plan.py)
        config["precision"] = precision
    if bert.vocab_path:
        name = os.path.basename(bert.vocab_path)
        shutil.copyfile(bert.vocab_path, os.path.join(directory, name))
        config["tokenizer"]["path"] = name
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def student_card(bert: inference.LoadedBiLSTM, meta: CheckpointMeta, path_hint: str) -> str:
    """A BiLSTM student's model card: what it is, what it was distilled from, how to load it."""
    s, task = bert.student, bert.task
    pairs = ", each sentence of a pair read by it and the two combined as [h1, h2, h1*h2, |h1-h2|]" if s.pairs else ""
    return "\n".join([
        f"# A BiLSTM student distilled for {task.name}", "",
        f"Exported by `python -m bertjax.export --format=params` (step {meta.step}).", "", "## Architecture", "",
        f"- word embeddings of {s.embedding_size} over the teacher's vocabulary ({s.vocab_size} rows), a bidirectional "
        f"LSTM of {s.hidden_size} units each way max-pooled over the real tokens{pairs}, a ReLU layer of "
        f"{s.mlp_size}, {s.num_labels} logits (Tang et al. 2019)",
        f"- {bert.num_params():,} parameters; a {task.kind} task" + (
            f" over {len(task.labels)} labels ({', '.join(task.labels)})" if task.labels else ""),
        f"- distilled from `{meta.distill.get('teacher')}`, whose tokenizer it reads", "", "## Loading", "",
        "```python", "import bertjax", "", f'model = bertjax.load("{path_hint}")',
        'model.predict(["a sentence"])', "```", ""])


def write_savedmodel(bert, directory: str, max_seq_length: int | None) -> None:
    savedmodel.export_savedmodel(bert, directory, max_seq_length=max_seq_length)


def say_smaller_groups(params: dict, mode: str | None) -> None:
    """A grouped mode's kernels whose inputs do not split into groups of G got the largest group that splits
    them: said, not silent."""
    group = quantization.scheme(mode).group if quantization.resolve(mode) not in (None, quantization.MIXED) else None
    smaller = quantization.smaller_groups(params, group) if group else []
    if smaller:
        sizes = sorted({size for _, size in smaller})
        say(f"quantize={mode}: {len(smaller)} kernels' inputs do not split into groups of {group} "
            f"({smaller[0][0]}, ...): they have groups of {', '.join(map(str, sizes))}, the largest that split them")


def _check_request(source: str, to: str, export_format: str, quantize: str | None, size_budget: float | None,
                   dev: str | None) -> bool:
    """One line for each flag that cannot be; whether quantize is "mixed", which --size_budget and --dev
    go with."""
    if export_format not in FORMATS:
        raise ValueError(f"--format={export_format}: choose one of {', '.join(FORMATS)}")
    if not source or not to:
        raise ValueError("--from and --to are required")
    if quantize and export_format in ("hf", "sentence-transformers"):
        raise ValueError(f"--format={export_format} --quantize: transformers reads no int8 BERT format without extra "
                         "packages (its int8 loaders need bitsandbytes, quanto, torchao or compressed-tensors); export "
                         f"int8 as --format=params or --format=savedmodel, or {export_format} without --quantize")
    mixed = quantization.resolve(quantize) == quantization.MIXED
    if mixed and (size_budget is None or not dev):
        raise ValueError("--quantize=mixed chooses int4 or int8 per layer on a dev set: give --size_budget (the dense "
                         "kernels' share of their float32 bytes, e.g. 0.2) and --dev (the task's dev file)")
    if not mixed and (size_budget is not None or dev):
        raise ValueError("--size_budget and --dev choose the layers' precisions of --quantize=mixed: add "
                         "--quantize=mixed, or leave them out")
    return mixed


def _card(bert, meta: CheckpointMeta, chosen: str, directory: str, export_format: str, to: str) -> str:
    """The export's README.md (written into `directory`, renamed to `to`): the model card, with the quantisation
    where there is one; a BiLSTM student's own card."""
    if isinstance(bert, inference.LoadedBiLSTM):
        return student_card(bert, meta, to)
    written_config = os.path.join(directory, *([hf_electra.DISCRIMINATOR_DIR] if meta.electra else []), "config.json")
    if not os.path.exists(written_config):  # an inference-free SparseEncoder: its Router's document side
        written_config = os.path.join(directory, sentence_transformers.DOCUMENT_TRANSFORMER, "config.json")
    written = json.loads(open(written_config).read()) if export_format in ("hf", "sentence-transformers") else {}
    card = model_card.model_card(workdir=checkpoint.workdir_of(chosen), meta=meta, params=bert.params,
                                 export_format=export_format,
                                 path_hint=os.path.join(to, hf_electra.DISCRIMINATOR_DIR) if meta.electra else to,
                                 hf_architecture=(written.get("architectures") or [None])[0])
    if bert.quantize:
        card += (f"\nQuantised: every dense layer's kernel is {quantization.describe(bert.quantize)} "
                 f"({bert.quantize}, bertjax/compression/quantize.py); bertjax.load reads it as such.\n")
    return card


def export(source: str, to: str, export_format: str, *, step: int | None = None, overwrite: bool = False,
           max_seq_length: int | None = None, hf_class: str = "pretraining", quantize: str | None = None,
           size_budget: float | None = None, dev: str | None = None) -> str:
    """Writes the export; returns its directory (and says where it is, and how to load it). A temporary
    directory beside `to` is renamed into place
    at the end, so nothing is half-written if anything fails. quantize="mixed": int4 or int8 per encoder
    layer, chosen on the dev set `dev` within size_budget (bertjax/runs/precision_plan.py)."""
    mixed = _check_request(source, to, export_format, quantize, size_budget, dev)
    to = os.path.abspath(to)
    if os.path.exists(to) and (not os.path.isdir(to) or os.listdir(to)) and not overwrite:
        raise ValueError(f"--to={to} exists and is not empty: choose a new directory, or pass --overwrite")
    chosen = checkpoint_to_export(source, step)
    bert, precision = (precision_plan.plan_from_path(chosen, dev, size_budget) if mixed
                       else (inference.load(chosen, quantize=quantize), None))
    if isinstance(bert, inference.LoadedBiLSTM) and export_format != "params":
        raise ValueError(f"--format={export_format}: {source} is a BiLSTM student (task distillation), which no other "
                         "tool's format holds: export it with --format=params (bertjax.load reads it)")
    say_smaller_groups(bert.params, quantize)
    _, meta = checkpoint.restore_params(chosen)
    if step is not None and meta.step != step:
        raise ValueError(f"--step={step}: that checkpoint is unreadable (the newest readable one is step "
                         f"{meta.step}); export that step or another")
    temporary = f"{to}.export-tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    try:
        if export_format == "hf" and meta.electra is not None:
            write_electra_pair(bert, temporary, meta, checkpoint.restore_params(chosen)[0])
        elif export_format == "hf":
            write_hf(bert, temporary, hf_class)
        elif export_format == "params":
            write_params(bert, temporary, meta, precision)
        elif export_format == "sentence-transformers":
            write_sentence_transformers(bert, temporary)
        else:
            write_savedmodel(bert, temporary, max_seq_length)
        with open(os.path.join(temporary, "README.md"), "w") as f:
            f.write(_card(bert, meta, chosen, temporary, export_format, to))
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


