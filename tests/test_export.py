"""python -m bertjax.export: each format loaded by its own library in a fresh process, its outputs equal to
bertjax's within 1e-5 (fp32): MLM, NSP and pooled outputs, fill-mask top-k, a fine-tuned head's logits;
the Hugging Face round trip back into bertjax.load; the model card; and the mistakes, each one line,
with nothing half-written left behind."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE_FLAGS, copy_of, run_command  # what this process compiles with: its programs too

import bertjax
from bertjax.runs import exporting
from bertjax.runs import finetuning
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
from test_finetune import small_config
from test_finetune_spans import qa_run, tagging_run  # noqa: F401  (the span reader and the tagger, made once per run)

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": FAST_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu",
       "CUDA_VISIBLE_DEVICES": ""}
TEXTS = ["The function returns a list of the lines in the file.", "Naïve café — «quoted» text, résumé!",
         "short"]
MASKED = ["The function [MASK] a list.", "If the key is not found, a [MASK] is raised."]

HF_SCRIPT = r"""
import json, logging, os, sys
import numpy as np, torch, transformers
warnings = {}
stage = "tokenizer"
class Catch(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.setdefault(stage, []).append(record.getMessage())
logging.getLogger("transformers").addHandler(Catch())
transformers.logging.set_verbosity_warning()
texts = json.loads(sys.argv[1]); masked = json.loads(sys.argv[2])
for path, out, kind in zip(sys.argv[3::3], sys.argv[4::3], sys.argv[5::3]):
    warnings, stage = {}, "tokenizer"
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    result = {"input_ids": batch["input_ids"].numpy(), "attention_mask": batch["attention_mask"].numpy()}
    with torch.no_grad():
        if kind == "pretraining":
            stage = "pretraining"
            model = transformers.BertForPreTraining.from_pretrained(path).eval()
            o = model(**batch, output_hidden_states=True)
            result.update(mlm=o.prediction_logits.numpy(), nsp=o.seq_relationship_logits.numpy())
            result["pooled"] = model.bert.pooler(o.hidden_states[-1]).numpy()
            stage = "masked_lm"
            masked_lm = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()
            fill = transformers.pipeline("fill-mask", model=masked_lm, tokenizer=tokenizer, top_k=5)
            guesses = [fill(t) for t in masked]
            result["fill_tokens"] = np.array([[g["token"] for g in gs] for gs in guesses])
            result["fill_scores"] = np.array([[g["score"] for g in gs] for gs in guesses])
        elif kind == "masked_lm":
            stage = "masked_lm"
            masked_lm = transformers.AutoModelForMaskedLM.from_pretrained(path).eval()
            fill = transformers.pipeline("fill-mask", model=path, top_k=5)
            guesses = [fill(t) for t in masked]
            result["fill_tokens"] = np.array([[g["token"] for g in gs] for gs in guesses])
            result["fill_scores"] = np.array([[g["score"] for g in gs] for gs in guesses])
            result["mlm"] = masked_lm(**batch).logits.numpy()
        else:
            stage = "task"
            model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
            result["logits"] = model(**batch).logits.numpy()
            result["id2label"] = np.array([model.config.id2label[i] for i in range(model.config.num_labels)])
    np.savez(out, **result)
    with open(out + ".warnings.json", "w") as f:
        json.dump(warnings, f)
sys.stdout.flush()
os._exit(0)  # done: the interpreter's teardown of TensorFlow's modules takes seconds and writes nothing
"""


TF_SCRIPT = r"""
import json, os, sys
import numpy as np, tensorflow as tf
import tensorflow_text  # the tokenizer's ops
tf.config.set_visible_devices([], "GPU")
for job in json.loads(open(sys.argv[1], encoding="utf-8").read()):
    served = tf.saved_model.load(job["path"])
    result = {"signatures": np.array(sorted(served.signatures))}
    for name, fn in served.signatures.items():
        args = job["args"].get(name, job["args"]["default"])
        for key, value in fn(**{k: tf.constant(v) for k, v in args.items()}).items():
            value = value.numpy()
            if value.dtype == object:  # strings come back as UTF-8 bytes
                value = np.vectorize(lambda b: b.decode("utf-8"), otypes=[str])(value)
            result[f"{name}/{key}"] = value
    np.savez(job["out"], **result)
result = sorted(m for m in ("flax", "bertjax") if m in sys.modules)
assert not result, result  # TensorFlow alone served them (TensorFlow imports jax itself, through Keras)
sys.stdout.flush()
os._exit(0)  # done: the interpreter's teardown of TensorFlow's modules takes seconds and writes nothing
"""

LONG = " ".join(["A long sentence that the graph must cut at the fixed length."] * 12)
SERVED_TEXTS = TEXTS + [LONG]
SIGNATURE_ARGS = {  # what each signature is called with
    "default": {"texts": SERVED_TEXTS},  # encode, predict, tag
    "fill_mask": {"texts": MASKED},
    "predict_choices": {"contexts": SERVED_TEXTS[:2], "choices": [SERVED_TEXTS[:3], SERVED_TEXTS[1:4]]},
    "predict_pair": {"texts": SERVED_TEXTS, "text_pairs": SERVED_TEXTS[::-1]},
}


def run_savedmodels(models: dict, root, args=None) -> dict:
    """Each SavedModel {name: directory} loaded and called (SIGNATURE_ARGS, updated by args[name]) in one fresh
    process that imports TensorFlow and tensorflow_text alone: {name: {"signature/output": array}}."""
    jobs = [{"path": str(path), "out": str(root / f"{name}.npz"),
             "args": {**SIGNATURE_ARGS, **(args or {}).get(name, {})}}
            for name, path in models.items()]
    (root / "jobs.json").write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", TF_SCRIPT, str(root / "jobs.json")], env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: dict(np.load(root / f"{name}.npz", allow_pickle=False)) for name in models}


def run_hf(jobs: dict, root) -> dict:
    """Each Hugging Face directory {name: (directory, kind)} loaded by transformers in one fresh process:
    {name: (arrays, the warnings transformers logged, by stage)}."""
    args = [str(a) for name, (path, kind) in jobs.items() for a in (path, root / f"{name}.npz", kind)]
    done = subprocess.run([sys.executable, "-c", HF_SCRIPT, json.dumps(TEXTS), json.dumps(MASKED), *args], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: (dict(np.load(root / f"{name}.npz")), json.loads((root / f"{name}.npz.warnings.json").read_text()))
            for name in jobs}


def bertjax_pretraining_outputs(bert, input_ids, mask):
    net = bert_model.BertForPreTraining(bert.config)
    positions = np.broadcast_to(np.arange(input_ids.shape[1]), input_ids.shape).astype(np.int32)
    out = net.apply({"params": bert.params}, input_ids.astype(np.int32), np.zeros_like(input_ids, np.int32),
                    mask.astype(np.int32), positions, deterministic=True)
    return {k: np.asarray(out[k]) for k in ("mlm_logits", "nsp_logits", "pooled_output")}


@pytest.fixture(scope="module")
def exported(pretrained, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    workdir = copy_of(pretrained["workdir"], root / "pretrained")  # with training lines, for the model card
    (workdir / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "loss": 7.5, "mlm_loss": 6.8, "nsp_loss": 0.7, "mlm_accuracy": 0.05}) + "\n"
        + json.dumps({"step": 1, "split": "eval", "loss": 7.6, "mlm_accuracy": 0.04}) + "\n")
    return dict(root=root, hf=exporting.export(str(workdir), str(root / "hf"), "hf"),
                params=exporting.export(str(workdir), str(root / "params"), "params"))


@pytest.fixture(scope="module")
def hf_served(exported, pretrained, finetuned, tmp_path_factory):
    """The pretraining export, a masked-LM export and the fine-tuned classifier's export, each loaded by its
    transformers class (one fresh process for the three)."""
    root = tmp_path_factory.mktemp("hf-served")
    jobs = {"pretraining": (exported["hf"], "pretraining"),
            "masked_lm": (exporting.export(pretrained["workdir"], str(root / "mlm"), "hf", hf_class="masked_lm"),
                          "masked_lm"),
            "head": (exporting.export(finetuned["workdir"], str(root / "head"), "hf"), "classification")}
    return dict(run_hf(jobs, root), directories={name: path for name, (path, _) in jobs.items()})


@pytest.fixture(scope="module")
def tf_served(pretrained, tagging_run, qa_run, tmp_path_factory):  # noqa: F811
    """SavedModels of the task kinds tests/test_serving.py does not serve, through the export program's path
    and served by TensorFlow alone (one fresh process for them all): the tagger and the span reader
    (tests/test_finetune_spans.py) and a multiple-choice model fine-tuned here. {name: (outputs, bertjax.load
    of its workdir)}, and the reader's contexts. (The encoder and a classifier: tests/test_serving.py.)"""
    from test_finetune import keyword_sentences, write_jsonl
    from test_finetune_spans import QUESTION

    root = tmp_path_factory.mktemp("tf-served")
    rows = [s for s, _ in keyword_sentences(2)][:24]
    choice = [{"context": s, "choices": [s, rows[(i + 7) % 24], rows[(i + 11) % 24]], "label": 0}
              for i, s in enumerate(rows)]
    config = small_config("multiple_choice", pretrained, num_choices=3, train=write_jsonl(root / "c.jsonl", choice),
                          validation=write_jsonl(root / "cd.jsonl", choice[:8]))
    config.train.epochs = 0.5
    chooser = str(root / "chooser")
    finetuning.finetune(config, chooser)
    workdirs = {"tagger": (tagging_run["workdir"], 48), "chooser": (chooser, 48), "reader": (qa_run["workdir"], 64)}
    models = {name: bertjax.load(workdir) for name, (workdir, _) in workdirs.items()}
    # The reader's contexts: those that fit in one window, where both see the same tokens.
    reader = models["reader"]
    room = 64 - 3 - len(reader.tokenizer.encode([QUESTION])[0])
    contexts = [p["context"] for p in qa_run["dev"]["data"][0]["paragraphs"]
                if sum(len(ids) for ids in reader.tokenizer.encode(p["context"].split())) <= room]
    served = run_savedmodels(
        {name: exporting.export(workdir, str(root / f"{name}-served"), "savedmodel", max_seq_length=length)
         for name, (workdir, length) in workdirs.items()},
        root, args={"reader": {"answer": {"questions": [QUESTION] * len(contexts), "contexts": contexts}}})
    return dict({name: (served[name], models[name]) for name in workdirs}, contexts=contexts)


@pytest.mark.slow
def test_hf_export_loads_in_transformers_with_the_same_outputs(hf_served, pretrained):
    theirs, warnings = hf_served["pretraining"]
    assert "pretraining" not in warnings and "tokenizer" not in warnings, warnings  # nothing missing or unused
    bert = bertjax.load(pretrained["workdir"])
    ids = theirs["input_ids"]
    assert [list(r[m > 0]) for r, m in zip(ids, theirs["attention_mask"])] == \
        [list(r[m > 0]) for r, m in zip(bert.tokenize(TEXTS)["input_ids"], bert.tokenize(TEXTS)["input_mask"])]
    ours = bertjax_pretraining_outputs(bert, ids, theirs["attention_mask"])
    real = theirs["attention_mask"] > 0
    assert np.max(np.abs(ours["mlm_logits"][real] - theirs["mlm"][real])) < 1e-5 * max(1, np.abs(theirs["mlm"]).max())
    np.testing.assert_allclose(ours["nsp_logits"], theirs["nsp"], atol=1e-5)
    np.testing.assert_allclose(ours["pooled_output"], theirs["pooled"], atol=1e-5)
    guesses = bert.fill_mask(MASKED, top_k=5)
    assert [[g["token"] for g in gs[0]] for gs in guesses] == theirs["fill_tokens"].tolist()
    np.testing.assert_allclose([[g["score"] for g in gs[0]] for gs in guesses], theirs["fill_scores"], atol=1e-5)


@pytest.mark.slow
def test_a_masked_lm_export_fills_masks_with_nothing_reported(hf_served, pretrained):
    theirs, warnings = hf_served["masked_lm"]
    assert not warnings, warnings  # AutoModelForMaskedLM and pipeline("fill-mask"): nothing unused or missing
    bert = bertjax.load(pretrained["workdir"])
    guesses = bert.fill_mask(MASKED, top_k=5)
    assert [[g["token"] for g in gs[0]] for gs in guesses] == theirs["fill_tokens"].tolist()
    np.testing.assert_allclose([[g["score"] for g in gs[0]] for gs in guesses], theirs["fill_scores"], atol=1e-5)
    ours = bertjax_pretraining_outputs(bert, theirs["input_ids"], theirs["attention_mask"])
    real = theirs["attention_mask"] > 0
    assert np.max(np.abs(ours["mlm_logits"][real] - theirs["mlm"][real])) < 1e-5 * max(1, np.abs(theirs["mlm"]).max())


def test_hf_export_round_trips_into_bertjax(exported, pretrained):  # noqa: F811
    again = bertjax.load(exported["hf"])
    original = bertjax.load(pretrained["workdir"])
    same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))),
                                  original.params, again.params)
    assert all(jax.tree_util.tree_leaves(same))
    files = set(os.listdir(exported["hf"]))
    assert {"model.safetensors", "config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
            "README.md"} <= files


def test_params_export_is_the_parameter_tree(exported, pretrained, tmp_path):  # noqa: F811
    from flax import traverse_util

    directory = pathlib.Path(exported["params"])
    flat = dict(np.load(directory / "params.npz"))
    config = json.loads((directory / "config.json").read_text())
    original = traverse_util.flatten_dict(pretrained["params"], sep="/")
    assert set(flat) == set(original) and all(np.array_equal(flat[k], original[k]) for k in flat)
    assert BertConfig.from_dict(config["model"]) == pretrained["cfg"]
    assert (directory / config["tokenizer"]["path"]).exists()
    # Other JAX code in a fresh process: the tree from params.npz, the model from config.json, the same outputs.
    bert = bertjax.load(pretrained["workdir"])
    batch = bert.tokenize(TEXTS)
    script = r"""
import json, sys
import numpy as np
from flax import traverse_util
from bertjax.models import bert as bert_model
from bertjax.models.config import BertConfig
directory, out = sys.argv[1], sys.argv[2]
ids, mask = np.array(json.loads(sys.argv[3])), np.array(json.loads(sys.argv[4]))
config = json.load(open(f"{directory}/config.json"))
params = traverse_util.unflatten_dict(dict(np.load(f"{directory}/params.npz")), sep="/")
net = bert_model.BertForPreTraining(BertConfig.from_dict(config["model"]))
positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
o = net.apply({"params": params}, ids.astype(np.int32), np.zeros_like(ids, np.int32), mask.astype(np.int32), positions)
np.savez(out, mlm=np.asarray(o["mlm_logits"]), nsp=np.asarray(o["nsp_logits"]))
"""
    done = subprocess.run([sys.executable, "-c", script, str(directory), str(tmp_path / "p.npz"),
                           json.dumps(batch["input_ids"].tolist()), json.dumps(batch["input_mask"].tolist())],
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(tmp_path / "p.npz")
    ours = bertjax_pretraining_outputs(bert, batch["input_ids"], batch["input_mask"])
    np.testing.assert_allclose(theirs["mlm"], ours["mlm_logits"], atol=1e-5)
    np.testing.assert_allclose(theirs["nsp"], ours["nsp_logits"], atol=1e-5)


def test_a_params_export_is_read_by_the_one_init_from(exported, pretrained, tmp_path):  # noqa: F811
    """The one init-from reads a params export as bertjax.load does (the same config, params and tokenizer);
    pretraining and fine-tuning start from it, in the layout their run asks for; an int8 export is for
    inference only."""
    from bertjax import init_from

    path = exported["params"]
    start = init_from.resolve(path)
    assert start.kind == init_from.PARAMS_EXPORT
    model = init_from.load(start, model_overrides=dict(dtype="float32", attention_impl="auto",
                                                       attention_dropout_rate=0.0, word_embedding="auto",
                                                       remat_policy="none"))
    loaded = bertjax.load(path)
    assert model.config == loaded.config and model.meta.step == 1 and model.missing == []
    jax.tree_util.tree_map(np.testing.assert_array_equal, model.params, jax.device_get(loaded.params))
    assert start.tokenizer == model.tokenizer
    assert model.tokenizer.vocab_path == loaded.vocab_path == os.path.join(path, "vocab.txt")
    # Pretraining's train.init_from, into a run that scans its layers: stacked, placed as the state is.
    import dataclasses

    import flax.linen as nn
    from bertjax.runs import phases

    scanned = dataclasses.replace(pretrained["cfg"], scan_layers=True)
    shapes = jax.eval_shape(bert_model.BertForPreTraining(scanned).init, jax.random.key(0),
                            **bert_model.dummy_batch(1, 16, 2))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                                      nn.unbox(shapes))
    params = phases.initial_params(init_from.resolve(path, tokenizer=False), scanned, abstract)
    np.testing.assert_array_equal(params["bert"]["encoder"]["layers"]["mlp"]["output"]["kernel"][1],
                                  model.params["bert"]["encoder"]["layers_1"]["mlp"]["output"]["kernel"])

    rows = pathlib.Path(pretrained["files"]["train"]).read_text().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(rows[:32]) + "\n")
    (tmp_path / "dev.jsonl").write_text("\n".join(rows[32:48]) + "\n")
    config = small_config("classification", pretrained, labels=("no", "yes"), train=str(tmp_path / "train.jsonl"),
                          validation=str(tmp_path / "dev.jsonl"))
    config.train.init_from = path
    summary = finetuning.finetune(config, str(tmp_path / "run"))
    assert summary["steps"] == 2 and "accuracy" in summary["best"]["metrics"]["validation"]
    tuned = bertjax.load(str(tmp_path / "run"))
    assert tuned.task.kind == "classification" and tuned.vocab_path.endswith("vocab.txt")

    int8 = exporting.export(pretrained["workdir"], str(tmp_path / "int8"), "params", quantize="int8")
    with pytest.raises(ValueError, match=r"train.init_from=.* is an int8 params export \(int8-dynamic\): start from"):
        init_from.load(init_from.resolve(int8, what="train.init_from"))
    assert init_from.load(init_from.resolve(int8), quantized=True).meta.quantize == "int8-dynamic"


def test_the_model_card_says_what_the_model_is(exported, pretrained):  # noqa: F811
    card = (pathlib.Path(exported["hf"]) / "README.md").read_text()
    cfg = pretrained["cfg"]
    assert f"{cfg.num_layers} layers, hidden size {cfg.hidden_size}" in card
    assert f"{bert_model.count_params(pretrained['params']):,} parameters" in card
    assert "wordpiece" in card and "training, step 1: loss 7.5, mlm_loss 6.8" in card
    # BertForPreTraining's weights load as AutoModelForPreTraining with nothing unused; fill-mask wants the
    # masked-LM class alone, and the card says which export writes it.
    assert "held out, step 1: loss 7.6" in card and 'AutoModelForPreTraining.from_pretrained("' in card
    assert "--hf_class=masked_lm" in card
    # Every file of the export readable as the others are (safetensors writes through a 0600 temporary).
    modes = {f.name: f.stat().st_mode & 0o777 for f in pathlib.Path(exported["hf"]).iterdir()}
    assert len(set(modes.values())) == 1, modes


@pytest.mark.slow
def test_a_fine_tuned_head_exports_to_its_transformers_class(hf_served, finetuned):
    theirs, warnings = hf_served["head"]
    assert not warnings, warnings
    assert theirs["id2label"].tolist() == ["no", "yes"]
    bert = bertjax.load(finetuned["workdir"])
    ours = np.asarray(bert._task_logits(bert.params, theirs["input_ids"].astype(np.int32),
                                        np.zeros_like(theirs["input_ids"], np.int32),
                                        theirs["attention_mask"].astype(np.int32)))
    np.testing.assert_allclose(ours, theirs["logits"], atol=1e-5)
    card = (pathlib.Path(hf_served["directories"]["head"]) / "README.md").read_text()
    assert "fine-tuned for classification" in card and "dev (validation): accuracy" in card


def test_mistakes_are_one_line_and_leave_nothing_behind(exported, pretrained, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="--format=hugging: choose one of hf, savedmodel, params"):
        exporting.export(pretrained["workdir"], str(tmp_path / "x"), "hugging")
    with pytest.raises(ValueError, match=r"--step=7: .* has checkpoints at steps 1"):
        exporting.export(pretrained["workdir"], str(tmp_path / "x"), "hf", step=7)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="has no checkpoint"):
        exporting.export(str(empty), str(tmp_path / "x"), "hf")
    with pytest.raises(ValueError, match="does not exist"):
        exporting.export(str(tmp_path / "missing"), str(tmp_path / "x"), "hf")
    with pytest.raises(ValueError, match="exists and is not empty: .* --overwrite"):
        exporting.export(pretrained["workdir"], exported["params"], "hf")
    assert not (tmp_path / "x").exists() and not [p for p in os.listdir(tmp_path) if "export-tmp" in p]
    # --overwrite replaces it whole.
    target = exporting.export(pretrained["workdir"], str(tmp_path / "twice"), "params")
    exporting.export(pretrained["workdir"], target, "hf", overwrite=True)
    assert "model.safetensors" in os.listdir(target) and "params.npz" not in os.listdir(target)
    # The program: the same line, a non-zero exit, no traceback.
    done = run_command([sys.executable, "-m", "bertjax.export", f"--from={pretrained['workdir']}",
                        f"--to={tmp_path / 'y'}", "--format=onnx"], env=ENV, timeout=120)
    assert done.returncode != 0 and "--format=onnx: choose one of hf, savedmodel, params" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "y").exists()


def test_a_sentencepiece_model_exports_a_tokenizer_with_the_same_ids(tmp_path):
    """tokenizer.json through the tokenizers library: AutoTokenizer gives bertjax's ids, case-folded or not."""
    import flax.linen as nn
    import transformers

    from bertjax.training import checkpoint
    from bertjax.training.checkpoint_meta import CheckpointMeta
    from bertjax.data import demo
    from bertjax.text import vocab_learning as vocabularies

    sentences = [s for doc in demo.demo_documents(200) for s in doc]
    texts = ["The function returns a list.", "  Naïve  café — «quoted» ﬁle, RÉSUMÉ!  ", "日本語 text 123,456.78",
             "Tabs\tand\nnewlines", "x"]
    for lower_case in (True, False):
        workdir = tmp_path / f"sp-{lower_case}"
        workdir.mkdir()
        vocabularies.learn_sentencepiece_model(iter(sentences), 800, str(workdir / "sp.model"), lower_case)
        cfg = BertConfig(vocab_size=800, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                    max_position_embeddings=64)
        params = bert_model.BertForPreTraining(cfg).init(jax.random.key(0),
                                                         **bert_model.dummy_batch(1, 16, 2))["params"]
        meta = {"step": 1, "model": cfg.__dict__,
                "tokenizer": {"kind": "sentencepiece", "path": "sp.model", "lower_case": lower_case}}
        saver = checkpoint.Checkpointer(str(workdir), every_steps=1, keep=1, async_save=False)
        saver.save(1, jax.device_get(nn.unbox(params)), {"count": np.zeros((), np.int32)},
                   CheckpointMeta.from_json(meta), force=True)
        saver.wait()
        saver.close()
        directory = exporting.export(str(workdir), str(tmp_path / f"hf-{lower_case}"), "hf")
        assert "tokenizer.json" in os.listdir(directory)
        theirs = transformers.AutoTokenizer.from_pretrained(directory)
        bert = bertjax.load(str(workdir))
        assert [theirs(t)["input_ids"] for t in texts] == [[bert.tokenizer.cls_id, *ids, bert.tokenizer.sep_id]
                                                            for ids in bert.tokenizer.encode(texts)]
        assert theirs.mask_token_id == bert.tokenizer.mask_id and theirs.pad_token_id == bert.tokenizer.pad_id


@pytest.mark.slow
def test_tagging_and_multiple_choice_savedmodels_equal_bertjax(tf_served):
    from test_finetune_spans import TAGS

    served, tagger = tf_served["tagger"]
    texts = SERVED_TEXTS
    ours = tagger.predict([t.split() for t in texts])
    for n, out in enumerate(ours):
        words = [w for w, _ in out["tags"]]
        assert served["tag/words"][n][:len(words)].tolist() == words
        cut = [t for t in served["tag/tags"][n][:len(words)].tolist() if t]  # words past S: no tag
        assert cut == [t for _, t in out["tags"]][:len(cut)] and set(cut) <= set(TAGS)
    assert sum(1 for t in served["tag/tags"][-1] if t) < len(LONG.split())  # the long text was cut

    served, chooser = tf_served["chooser"]
    ours = chooser.predict(texts[:2], choices=[texts[:3], texts[1:4]])
    np.testing.assert_allclose(served["predict_choices/probabilities"], [o["scores"] for o in ours], atol=1e-5)
    assert served["predict_choices/label_index"].tolist() == [o["label"] for o in ours]


@pytest.mark.slow
def test_span_savedmodel_answers_with_the_whole_words_of_bertjax_answer(tf_served):
    from test_finetune_spans import QUESTION

    served, bert = tf_served["reader"]
    contexts = tf_served["contexts"]
    assert len(contexts) >= 3  # contexts that fit in one window: there both see the same tokens
    # In one window both find the same best tokens; bertjax answers with their exact characters, the
    # SavedModel with the whole words around them.
    ours = bert.predict(questions=[QUESTION] * len(contexts), contexts=contexts)
    for context, mine, theirs in zip(contexts, ours, served["answer/answer"].tolist()):
        begin = context.rfind(" ", 0, mine["start"]) + 1
        end = context.find(" ", mine["end"])
        assert theirs == context[begin:len(context) if end < 0 else end]
