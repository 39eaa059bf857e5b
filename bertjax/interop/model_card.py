"""The README.md model card every export writes: what the model is, what it was trained on, how far,
how well, and how to load it. Everything comes from the workdir: the checkpoint's meta, config.json,
metrics.jsonl and, for a fine-tuned model, summary.json."""

import json
from bertjax.models import bert as bert_model

from bertjax.models.config import BertConfig
from bertjax.text import files
from bertjax.tasks import kinds
from bertjax.training.checkpoint_meta import CheckpointMeta, TaskRecord, TokenizerRecord

# How each export format is loaded, shown in the card.
_LOADING = {
    "hf": """```python
from transformers import AutoTokenizer, {auto_class}, pipeline

tokenizer = AutoTokenizer.from_pretrained("{path}")
model = {auto_class}.from_pretrained("{path}")
{pipeline}```""",
    "savedmodel": """Python needs `tensorflow` and `tensorflow-text` (`pip install tensorflow tensorflow-text`), and
`import tensorflow_text` before loading: it registers the tokenizer's ops the graph runs (`NormalizeUTF8`
and others), and without it `tf.saved_model.load` fails with "Op type not registered 'NormalizeUTF8'".

```python
import tensorflow as tf
import tensorflow_text  # registers the tokenizer's ops (NormalizeUTF8 and others): import it before loading

served = tf.saved_model.load("{path}")
served.signatures["encode"](texts=tf.constant(["A sentence."]))
```

or TF Serving: `docker run -p 8501:8501 -v {path}:/models/bert/1 -e MODEL_NAME=bert tensorflow/serving`.""",
    "params": """```python
import json, numpy as np
from flax import traverse_util
from bertjax.models import bert
from bertjax.models.config import BertConfig

config = json.load(open("{path}/config.json"))
params = traverse_util.unflatten_dict(dict(np.load("{path}/params.npz")), sep="/")
net = bert.BertForPreTraining(BertConfig.from_dict(config["model"]))   # or the task's head
```""",
    "sentence-transformers": """```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("{path}")
embeddings = model.encode(["A sentence.", "Another one."])   # as bertjax.load("{path}").embed([...])
```""",
    "sparse-encoder": """```python
from sentence_transformers import SparseEncoder

model = SparseEncoder("{path}")
queries = model.encode_query(["a question"])   # SPLADE vectors over the vocabulary, as bertjax's embed
documents = model.encode_document(["A passage."])
model.similarity(queries, documents)   # dot products
```""",
    "multi-vector-encoder": """```python
from sentence_transformers import MultiVectorEncoder

model = MultiVectorEncoder("{path}")
queries = model.encode_query(["a question"])   # ColBERT token vectors, as bertjax's embed_tokens
documents = model.encode_document(["A passage."])
model.similarity(queries, documents)   # MaxSim
```""",
    "cross-encoder": """```python
from sentence_transformers import CrossEncoder

model = CrossEncoder("{path}")
model.predict([("A sentence.", "Its pair.")])   # the head's logits; apply_softmax=True: its probabilities
```""",
}

def _read_json_lines(path: str) -> list[dict]:
    p = files.path(path)
    if not p.exists():
        return []
    lines = []
    for raw in p.read_text().splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: the card shows what the rest says
    return lines


def _read_json(path: str) -> dict:
    p = files.path(path)
    return json.loads(p.read_text()) if p.exists() else {}


def _figures(line: dict, keys) -> str:
    return ", ".join(f"{k} {line[k]:.4g}" for k in keys if isinstance(line.get(k), (int, float)))


def model_card(*, workdir: str, meta: CheckpointMeta, params: dict, export_format: str, path_hint: str,
               hf_architecture: str | None = None) -> str:
    """The card's markdown text; hf_architecture: the transformers class an hf export was written as."""
    cfg = BertConfig.from_dict(meta.model)
    config = _read_json(files.join(workdir, "config.json"))
    metrics = _read_json_lines(files.join(workdir, "metrics.jsonl"))
    summary = _read_json(files.join(workdir, "summary.json"))
    task, step = meta.task, meta.step
    title = f"BERT fine-tuned for {task.name}" if task else "BERT pretrained with bertjax"
    if meta.electra and not task:
        title = ("ELECTRA pretrained with bertjax: discriminator/ (ElectraForPreTraining) and generator/ "
                 "(ElectraForMaskedLM)")
    lines = [f"# {title}", "",
             f"Exported by `python -m bertjax.export --format={export_format}` from `{workdir}` (step {step}).", ""]
    lines += _architecture(cfg, params, task, bool(meta.electra))
    lines += _tokenizer(cfg, meta.tokenizer)
    lines += ["## Training", ""]
    lines += _fine_tuning(config, task) if task else _pretraining(config, metrics, step)
    lines += ["", "## Results", ""]
    lines += _dev_results(summary, meta) if task else _pretraining_results(metrics)
    representation = meta.embedding.representation if meta.embedding is not None else "dense"
    lines += ["", "## Loading", "", _loading(export_format, task, path_hint, hf_architecture, representation), ""]
    return "\n".join(lines)


def _architecture(cfg, params: dict, task: TaskRecord | None, electra: bool = False) -> list[str]:
    if electra and not task:
        head = " in the discriminator's encoder; a replaced-token head, and a generator beside it"
    elif task:
        labels = task.labels
        head = f"; a {task.kind} head" + (f" over {len(labels)} labels ({', '.join(labels)})" if labels else "")
    else:
        head = "; masked-LM and next-sentence heads"
    return ["## Architecture", "",
            f"- {cfg.num_layers} layers, hidden size {cfg.hidden_size}, {cfg.num_heads} attention heads, "
            f"intermediate size {cfg.intermediate_size}, {cfg.max_position_embeddings} positions",
            f"- {bert_model.count_params(params):,} parameters" + head,
            f"- {'pre' if cfg.pre_layer_norm else 'post'}-layer-norm, layer-norm epsilon {cfg.layer_norm_eps}", ""]


def _tokenizer(cfg, tokenizer: TokenizerRecord | None) -> list[str]:
    casing = "" if tokenizer is None else f", {'lower-cased' if tokenizer.lower_case else 'cased'}"
    kind = tokenizer.kind if tokenizer is not None else "unknown"
    return ["## Tokenizer", "", f"- {kind}, {cfg.vocab_size:,} entries in the model's vocabulary{casing}", ""]


def _fine_tuning(config: dict, task: TaskRecord) -> list[str]:
    """The task's files (or its TFDS name), epochs, batch and learning rate, and the starting weights."""
    data, train = config.get("data") or {}, config.get("train") or {}
    files = {k: data.get(k) for k in ("train", "validation", "test") if data.get(k)}
    source = ", ".join(f"{k} {v}" for k, v in files.items()) or f"TFDS ({task.name})"
    lines = [f"- fine-tuned on {source}, {train.get('epochs', '?')} epochs of batch {train.get('batch_size', '?')},"
             f" learning rate {(config.get('optimizer') or {}).get('learning_rate', '?')}"]
    if config.get("init_from"):
        lines.append(f"- from `{config['init_from']}`")
    return lines


def _pretraining(config: dict, metrics: list[dict], step: int | None) -> list[str]:
    """The corpus, how much of it was seen (and how much of that was real tokens, not padding), the masking
    and the optimizer."""
    data, train, optimizer = config.get("data") or {}, config.get("train") or {}, config.get("optimizer") or {}
    source = data.get("source", "?")
    detail = {"tfds": data.get("tfds_name"), "files": data.get("input_pattern"),
              "prepared": data.get("prepared_dir")}.get(source)
    lines = [f"- data: {source}" + (f" ({detail})" if detail else "")]
    batch, seq = train.get("batch_size"), data.get("max_seq_length")
    if step and batch and seq:
        efficiency = [m["padding_efficiency"] for m in metrics if "padding_efficiency" in m and "split" not in m]
        real = (f", about {int(step * batch * seq * sum(efficiency) / len(efficiency)):,} of them real"
                if efficiency else "")
        lines.append(f"- {step:,} steps of {batch} sequences of {seq} tokens: {step * batch:,} sequences, "
                     f"{step * batch * seq:,} token positions seen{real}")
    masking = "whole_word" if data.get("whole_word_masking") else data.get("masking") or "token"
    masking = masking.replace("_", "-")
    rate = data.get("masked_lm_prob") or data.get("mask_rate", 0.15)  # the older key wins, as in training
    phases = data.get("mask_rate_schedule") or ()
    rate = " then ".join(f"{r:g} from step {s:,}" for s, r in phases) if phases else f"{rate:g}"
    lines.append(f"- {masking} masking, {rate} of the tokens, {data.get('objective', 'nsp')} objective, "
                 f"{optimizer.get('name', '?')} at learning rate {optimizer.get('learning_rate', '?')}")
    return lines


def _dev_results(summary: dict, meta: CheckpointMeta) -> list[str]:
    """The best dev checkpoint's metrics, from summary.json (or the checkpoint's meta where it is missing)."""
    best = summary.get("best") or (meta.best or {})
    lines = []
    for split, values in (best.get("metrics") or {}).items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in values.items() if isinstance(v, (int, float)))
        lines.append(f"- dev ({split}): {shown}")
    if best.get("step") is not None:
        lines.append(f"- the best dev checkpoint, step {best['step']}, main metric {summary.get('main_metric', '?')}")
    if not best:
        lines.append("- no dev evaluation recorded")
    return lines


def _pretraining_results(metrics: list[dict]) -> list[str]:
    """The last training and held-out lines of metrics.jsonl."""
    keys = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")
    trained = [m for m in metrics if "split" not in m and "loss" in m]
    held_out = [m for m in metrics if m.get("split") == "eval"]
    lines = []
    if trained:
        lines.append(f"- training, step {trained[-1]['step']}: {_figures(trained[-1], keys)}")
    if held_out:
        lines.append(f"- held out, step {held_out[-1]['step']}: {_figures(held_out[-1], keys)}")
    if not trained and not held_out:
        lines.append("- no metrics.jsonl in the workdir")
    return lines


def _loading(export_format: str, task: TaskRecord | None, path_hint: str, hf_architecture: str | None,
             representation: str = "dense") -> str:
    """How to load the export. A pretraining class (BertForPreTraining, AlbertForPreTraining) loads as
    itself, with nothing unused; the fill-mask pipeline takes a masked-LM class (--hf_class=masked_lm). A
    sentence-transformers export is the class its representation needs (the EmbeddingRecord's)."""
    pretraining_class = (hf_architecture or "").endswith("ForPreTraining")
    if task:
        hf_class = kinds.get(task.kind).hf_class  # None: no transformers task class (contrastive: the encoder)
        auto_class = hf_class["auto_class"] if hf_class else "AutoModel"
    else:
        auto_class = "AutoModelForPreTraining" if pretraining_class else "AutoModelForMaskedLM"
    if task:
        pipe = ""
    elif pretraining_class:
        pipe = ('# pipeline("fill-mask") wants the masked-LM class alone: export with --hf_class=masked_lm\n')
    else:
        pipe = 'pipeline("fill-mask", model=model, tokenizer=tokenizer)("The capital of France is [MASK].")\n'
    if export_format == "sentence-transformers" and task:
        export_format = {"splade": "sparse-encoder", "colbert": "multi-vector-encoder"}.get(
            representation, "sentence-transformers" if task.kind == "contrastive" else "cross-encoder")
    return _LOADING[export_format].format(path=path_hint, auto_class=auto_class, pipeline=pipe)
