"""bertjax.interop.savedmodel.export_savedmodel: the SavedModel, loaded in a fresh process that imports only
tensorflow and tensorflow_text, tokenizes raw strings inside its graph into exactly bertjax's ids and
gives bertjax's outputs within 1e-5 (float32): encode, fill_mask (several masks per text, at the
start, the end, side by side), predict and predict_pair (pairs cut as features.encode_pair cuts them).

The SavedModel must stand alone: it is moved away from where it was written and the vocabulary file
is hidden while it runs, and its weights are variables, not constants in the graph.

Shape legend (as in bertjax/models/bert.py): B batch, S max_seq_length, H hidden size, P masks, k top_k.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE_FLAGS, copy_of, run_program  # what this process compiles with: its programs too

import bertjax
from bertjax.models import heads
from bertjax.interop import savedmodel
from bertjax.tasks import features
from bertjax.training.checkpoint_meta import TaskRecord

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": FAST_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu",
       "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
S = 32  # the fixed length of the served graph

LONG = " ".join(["A long sentence that the graph must cut at the fixed length."] * 8)  # > S tokens
TEXTS = [
    "The function returns a list of the lines in the file.",
    "Naïve café — «quoted» text, résumé! ÉCOLE Ångström: 東京 (CJK) & $5.00?",
    "tabs\tand\nnew lines,\u00a0no-break spaces and a control \x07 character",
    "a literal [MASK] is plain text to encode",
    "",
    "   ",
    LONG,
]
MASKED = [
    "The function [MASK] a list.",
    "[MASK] starts it, two [MASK][MASK] side by side, and it ends with [MASK]",
    "Naïve [MASK] café — «quoted»!",
    "If the key is not found, a [MASK] is raised.",
]
PAIRS = [  # (A, B): A longer, B longer, both long, equal, an empty B, accents
    (LONG, "short"),
    ("short", LONG),
    (LONG, LONG[::-1]),
    ("one two three", "four five six"),
    ("only a first text", ""),
    ("Naïve café?", "Résumé, «quoted»."),
]

SCRIPT = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # registers the tokenizer's ops the graph uses

jobs, out = json.loads(open(sys.argv[1], encoding="utf-8").read()), sys.argv[2]
result = {}
for job in jobs:
    model = tf.saved_model.load(job["dir"])
    result[job["tag"] + "/signatures"] = np.array(sorted(model.signatures))
    fn = model.signatures[job["signature"]]
    for key, value in fn(**{k: tf.constant(v, tf.string) for k, v in job["args"].items()}).items():
        value = value.numpy()
        if value.dtype == object:  # strings come back as UTF-8 bytes
            value = np.array([[b.decode("utf-8") for b in row] for row in value.reshape(len(value), -1)])
        result[job["tag"] + "/" + key] = value
result["modules"] = np.array(sorted(m for m in ("flax", "bertjax") if m in sys.modules))
np.savez(out, **result)
sys.stdout.flush()
os._exit(0)  # done: the interpreter's teardown of TensorFlow's modules takes seconds and writes nothing
"""


def serve(jobs, tmp_path):
    """Runs each job {"tag", "dir", "signature", "args"} in one fresh TensorFlow process; its outputs by tag/key."""
    spec, out = tmp_path / "jobs.json", tmp_path / "served.npz"
    spec.write_text(json.dumps(jobs), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(spec), str(out)], env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = dict(np.load(out, allow_pickle=False))
    # Served by TensorFlow alone (TensorFlow 2.21 imports jax itself, through Keras: not a sign).
    assert result["modules"].tolist() == []
    return result


@pytest.fixture(scope="module")
def workdir(pretrained):
    """A bertjax workdir with a small random BERT (conftest's `pretrained`, read-only)."""
    return pathlib.Path(pretrained["workdir"])


def classifier(bert, kind="classification", labels=("no", "maybe", "yes")):
    """A fine-tuned-looking task model in memory: the pretrained encoder under a random head."""
    num_labels = len(labels) if kind == "classification" else None
    net = heads.network(kind, bert.config, num_labels)
    params = nn.unbox(net.init(jax.random.key(1), **heads.dummy_inputs(kind, 1, 16))["params"])
    params = heads.with_pretrained_encoder(params, jax.device_get(bert.params))
    task = TaskRecord("test", kind, tuple(labels) if num_labels else (), None, S)
    return bertjax.inference.LoadedBert(bert.config, jax.device_get(params), bert.tokenizer, task=task)


def largest_constant(saved_model_pb) -> int:
    """Bytes of the largest Const value anywhere in a SavedModel's graph and functions."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString(saved_model_pb.read_bytes())
    graph = saved.meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return max(n.attr["value"].ByteSize() for n in nodes if n.op == "Const")


def python_mask_positions(tokenizer, text):
    """Where LoadedBert.fill_mask puts each [MASK] of `text` (its own loop, repeated here)."""
    where, n = [], 1  # after [CLS]
    for i, ids in enumerate(tokenizer.encode(text.split("[MASK]"))):
        if i:
            where.append(n)
            n += 1
        n += len(ids)
    return where


@pytest.mark.slow
def test_savedmodel_equals_bertjax_in_a_fresh_process(workdir, tmp_path):
    workdir = copy_of(workdir, tmp_path / "pretrained")  # its vocabulary is hidden below
    bert = bertjax.load(workdir)
    written = tmp_path / "written"
    assert savedmodel.export_savedmodel(bert, str(written), max_seq_length=S) == ["encode", "fill_mask"]
    task = classifier(bert)
    assert "predict_pair" in savedmodel.export_savedmodel(task, str(tmp_path / "task-written"), max_seq_length=S)
    regression = classifier(bert, "regression", ())
    savedmodel.export_savedmodel(regression, str(tmp_path / "regression-written"), max_seq_length=S)
    reranker = classifier(bert, "rerank", ())
    assert savedmodel.export_savedmodel(reranker, str(tmp_path / "reranker-written"), max_seq_length=S) == ["encode",
        "predict_pair"]

    # The weights are variables, not constants: no constant in the graph is near the word embeddings'
    # size (the largest is the tokenizer's WordPiece model).
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(bert.params)]
    assert sum(f.stat().st_size for f in (written / "variables").iterdir()) >= sum(x.nbytes for x in leaves)
    assert largest_constant(written / "saved_model.pb") < max(x.nbytes for x in leaves) / 2

    # Self-contained: moved elsewhere, and the vocabulary it was made from out of reach.
    (tmp_path / "elsewhere").mkdir()
    served = {name: shutil.move(str(tmp_path / f"{name}-written"), str(tmp_path / "elsewhere" / name))
              for name in ("task", "regression", "reranker")}
    served["pretrained"] = shutil.move(str(written), str(tmp_path / "elsewhere" / "pretrained"))
    (workdir / "vocab.txt").rename(workdir / "vocab.hidden")
    try:
        pairs_a, pairs_b = [a for a, _ in PAIRS], [b for _, b in PAIRS]
        theirs = serve([
            {"tag": "encode", "dir": served["pretrained"], "signature": "encode", "args": {"texts": TEXTS}},
            {"tag": "fill", "dir": served["pretrained"], "signature": "fill_mask", "args": {"texts": MASKED}},
            {"tag": "cut", "dir": served["pretrained"], "signature": "fill_mask",  # past S, past MAX_MASKS, none
             "args": {"texts": [LONG + " [MASK] x", " ".join(["[MASK]"] * (savedmodel.MAX_MASKS + 2)), "no mask"]}},
            {"tag": "predict", "dir": served["task"], "signature": "predict", "args": {"texts": TEXTS}},
            {"tag": "pair", "dir": served["task"], "signature": "predict_pair",
             "args": {"texts": pairs_a, "text_pairs": pairs_b}},
            {"tag": "regression", "dir": served["regression"], "signature": "predict_pair",
             "args": {"texts": pairs_a, "text_pairs": pairs_b}},
            {"tag": "reranker", "dir": served["reranker"], "signature": "predict_pair",
             "args": {"texts": pairs_a, "text_pairs": pairs_b}},
        ], tmp_path)
    finally:
        (workdir / "vocab.hidden").rename(workdir / "vocab.txt")
    diffs = {}

    # encode: the graph's ids are bertjax's ([CLS] ids[:S-2] [SEP], the long text cut), padded to S.
    assert theirs["encode/signatures"].tolist() == ["encode", "fill_mask"]
    ours = bert.encode(TEXTS, max_length=S)
    n = ours["input_ids"].shape[1]
    assert n == S and theirs["encode/input_ids"].shape == (len(TEXTS), S)
    np.testing.assert_array_equal(theirs["encode/input_ids"], ours["input_ids"])
    np.testing.assert_array_equal(theirs["encode/input_mask"], ours["input_mask"])
    tok = bert.tokenizer
    assert [list(r[m > 0]) for r, m in zip(theirs["encode/input_ids"], theirs["encode/input_mask"])] == \
        [[tok.cls_id, *ids[:S - 2], tok.sep_id] for ids in tok.encode(TEXTS)]
    real = ours["input_mask"] > 0
    diffs["sequence_output"] = np.abs(theirs["encode/sequence_output"][real] - ours["sequence_output"][real]).max()
    diffs["pooled_output"] = np.abs(theirs["encode/pooled_output"] - ours["pooled_output"]).max()

    # fill_mask: the same masks, guesses and probabilities as LoadedBert.fill_mask, -1 past a text's masks.
    guesses = bert.fill_mask(MASKED, top_k=savedmodel.TOP_K)
    positions = theirs["fill/mask_positions"]
    assert positions.shape == (len(MASKED), savedmodel.MAX_MASKS)
    for b, (text, per_mask) in enumerate(zip(MASKED, guesses)):
        where = python_mask_positions(tok, text)
        assert positions[b].tolist() == where + [-1] * (savedmodel.MAX_MASKS - len(where))
        assert theirs["fill/top_ids"][b, :len(where)].tolist() == [[g["token"] for g in gs] for gs in per_mask]
        assert (theirs["fill/top_ids"][b, len(where):] == -1).all()
        scores = np.array([[g["score"] for g in gs] for gs in per_mask])
        differ = np.abs(theirs["fill/top_scores"][b, :len(where)] - scores).max()
        diffs["fill_mask"] = max(diffs.get("fill_mask", 0), differ)
    # A mask cut off with the text past S is no mask; at most MAX_MASKS are answered; none is fine.
    long_text = python_mask_positions(tok, LONG + " [MASK] x")
    assert long_text[0] > S - 2 and (theirs["cut/mask_positions"][0] == -1).all()
    assert theirs["cut/mask_positions"][1].tolist() == list(range(1, savedmodel.MAX_MASKS + 1))
    assert (theirs["cut/mask_positions"][2] == -1).all() and (theirs["cut/top_ids"][2] == -1).all()

    # predict / predict_pair: bertjax.load(...).predict's labels and probabilities; pairs cut as in training.
    labels = task.task.labels
    for tag, (texts, pairs) in {"predict": (TEXTS, None), "pair": (pairs_a, pairs_b)}.items():
        ours = task.predict(texts, text_pairs=pairs)
        assert theirs[f"{tag}/label"].reshape(-1).tolist() == [p["label"] for p in ours]
        assert theirs[f"{tag}/label_index"].tolist() == [labels.index(p["label"]) for p in ours]
        probabilities = np.array([[p["scores"][k] for k in labels] for p in ours])
        diffs[tag] = np.abs(theirs[f"{tag}/probabilities"] - probabilities).max()
    ours = regression.predict(pairs_a, text_pairs=pairs_b)
    diffs["regression"] = np.abs(theirs["regression/score"] - [p["score"] for p in ours]).max()
    ours = reranker.predict(pairs_a, text_pairs=pairs_b)
    diffs["reranker"] = np.abs(theirs["reranker/score"] - [p["score"] for p in ours]).max()
    print("max |served - bertjax|:", {k: float(v) for k, v in diffs.items()})
    assert max(diffs.values()) < 1e-5, diffs


def test_pairs_are_cut_in_the_graph_as_in_training(workdir):
    """The TF ops that cut a pair are features.truncated_lengths, every length up to 2S, and the
    pair rows equal features.encode_pair's."""
    import tensorflow as tf

    grid = np.stack(np.meshgrid(np.arange(2 * S), np.arange(2 * S)), -1).reshape(-1, 2)
    for max_length in (S - 3, S - 2, 1, 0):
        got = savedmodel._truncated_lengths(tf, tf.constant(grid[:, 0], tf.int64), tf.constant(grid[:, 1], tf.int64),
                                         max_length)
        want = features.truncated_lengths(grid[:, 0], grid[:, 1], max_length)
        np.testing.assert_array_equal(np.stack([g.numpy() for g in got]), np.stack(want))

    tok = bertjax.load(workdir).tokenizer
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    ids, segments, mask = (t.numpy() for t in savedmodel._pair(tf, tok, tf.constant(a), tf.constant(b), S))
    special = dict(template=tok.template, pad_id=tok.pad_id)
    want = [features.encode_pair(x, y, S, **special) for x, y in zip(tok.encode(a), tok.encode(b))]
    np.testing.assert_array_equal(ids, [w["input_ids"] for w in want])
    np.testing.assert_array_equal(segments, [w["segment_ids"] for w in want])
    np.testing.assert_array_equal(mask, [w["input_mask"] for w in want])


def test_a_length_the_model_cannot_take_is_refused(workdir, tmp_path):
    bert = bertjax.load(workdir)
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        savedmodel.export_savedmodel(bert, str(tmp_path / "too-long"), max_seq_length=65)
    assert not (tmp_path / "too-long").exists()


def readme_loading_snippet() -> str:
    """The README's Export section's Python block that loads the SavedModel."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Export\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1 and "tf.saved_model.load(" in blocks[0], blocks
    return blocks[0]


@pytest.mark.slow
def test_the_exported_savedmodel_loads_with_only_the_imports_the_readme_names(workdir, tmp_path):
    """python -m bertjax.export --format=savedmodel, then the README's snippet as written (its path changed)
    in a fresh Python. Without tensorflow_text the same load fails with the error the README names, and
    the export's last line says so too."""
    exported = tmp_path / "serving"
    done = run_program("bertjax.export", f"--from={workdir}", f"--to={exported}", "--format=savedmodel",
                       f"--max_seq_length={S}")  # the program as a user runs it; the loads below: fresh Pythons
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert "import tensorflow as tf, tensorflow_text" in last and "NormalizeUTF8" in last, last
    assert "import tensorflow_text" in (exported / "README.md").read_text()  # the model card

    snippet = readme_loading_snippet()
    assert snippet.splitlines()[0].startswith("import tensorflow as tf, tensorflow_text")
    check = ("import json, sys\n" + snippet.replace('"exports/tiny-serving"', repr(str(exported)))
             + "\nprint(json.dumps({'shape': list(out['pooled_output'].shape), 'signatures': sorted(served.signatures),"
             " 'modules': sorted(m for m in ('flax', 'bertjax') if m in sys.modules)}))\n")
    done = subprocess.run([sys.executable, "-c", check], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {"shape": [1, bertjax.load(workdir).config.hidden_size], "signatures": ["encode", "fill_mask"],
                      "modules": []}

    without = check.replace("import tensorflow as tf, tensorflow_text", "import tensorflow as tf", 1)
    done = subprocess.run([sys.executable, "-c", without], env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Op type not registered 'NormalizeUTF8'" in done.stderr, done.stderr[-3000:]
