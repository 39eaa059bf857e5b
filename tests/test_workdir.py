"""Remote workdirs (gs://): a whole train -> resume -> load cycle against a local, in-memory GCS
emulator (gcp-storage-emulator, in a thread of this process), with no network. Orbax's arrays go
through tensorstore's gcs driver (TENSORSTORE_GCS_HTTP_URL), every other file through etils.epath on
gcsfs (EPATH_USE_TF=false: TensorFlow's gs:// client has no emulator setting; STORAGE_EMULATOR_HOST).
Also: a workdir copied elsewhere loads from its new place, and a workdir bertjax cannot write to is
one line."""

import json
import os
import pathlib
import shutil
import socket
import sys

import numpy as np
import pytest
from conftest import FAST_COMPILE_FLAGS, run_command, tiny_config  # what this process compiles with: its programs too

from bertjax.text import files
from bertjax.training import workdir as workdirs
from bertjax.training import writers

REPO = pathlib.Path(__file__).resolve().parents[1]
BUCKET = "bertjax-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send_generations(emulator) -> None:
    """GCS answers a download with the object's generation (x-goog-generation), which tensorstore's
    OCDBT reads back for its conditional writes; the emulator leaves the header out, so add it."""
    from gcp_storage_emulator.handlers import objects

    original = objects.download
    if getattr(original, "sends_generation", False):
        return

    def download(request, response, storage, *args, **kwargs):
        original(request, response, storage, *args, **kwargs)
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except Exception:  # noqa: BLE001 -- not found: the 404 stands as it is
            return
        response["x-goog-generation"] = obj["generation"]
        response["x-goog-metageneration"] = obj["metageneration"]

    download.sends_generation = True
    objects.download = download  # objects.get calls it for ?alt=media
    for _, handlers in emulator.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original:
                handlers[method] = download


@pytest.fixture(scope="module")
def gcs():
    """The emulator's environment (for this process and the training subprocesses)."""
    pytest.importorskip("gcsfs")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # gcsfs's check for zonal buckets needs real credentials; the emulator has plain buckets only.
    env = {"EPATH_USE_TF": "false", "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test", "GOOGLE_CLOUD_PROJECT": "test",
           "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    _send_generations(emulator)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # epath decides once per process whether gs:// goes through TensorFlow (functools.cache): an earlier
    # test's local paths already asked, so ask again now that EPATH_USE_TF is false, and after.
    from etils.epath import gpath

    gpath._is_tf_installed.cache_clear()
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    try:
        yield env
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gpath._is_tf_installed.cache_clear()


def test_metrics_jsonl_and_events_on_an_object_store(gcs, tmp_path):
    import tensorflow as tf
    from etils import epath

    workdir = f"gs://{BUCKET}/writer"
    with writers.MetricWriter(workdir, console=False) as writer:
        writer.write_config({"train": {"num_steps": 3}})
        for step in (1, 2, 3):
            writer.write(step, {"loss": 4.0 - step})
    lines = [json.loads(line) for line in epath.Path(workdir, "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in lines] == [1, 2, 3]
    assert json.loads(epath.Path(workdir, "config.json").read_text()) == {"train": {"num_steps": 3}}
    (events,) = epath.Path(workdir, "tensorboard").glob("events.out.tfevents.*")
    local = tmp_path / events.name
    local.write_bytes(events.read_bytes())
    losses = {e.step: e.summary.value[0].simple_value for e in tf.compat.v1.train.summary_iterator(str(local))
              if e.summary.value and e.summary.value[0].tag == "loss"}
    assert losses == {1: 3.0, 2: 2.0, 3: 1.0}  # every step, the last one written when the writer closed

    with writers.MetricWriter(workdir, console=False) as writer:  # resumed from step 1's checkpoint
        writer.resumed(1)
        writer.write(2, {"loss": 2.5})
    lines = [json.loads(line) for line in epath.Path(workdir, "metrics.jsonl").read_text().splitlines()]
    assert [(record["step"], record.get("resumed_from")) for record in lines] == [(1, None), (2, 1)]
    assert not pathlib.Path("gs:").exists()


def test_a_vocabulary_learned_into_a_remote_workdir(gcs):
    from etils import epath

    from bertjax.data import inputs
    from bertjax.data.settings import DataSettings

    data = DataSettings(vocab_path=None, tokenizer="wordpiece", vocab_size=60, lower_case=True)
    documents = [[" ".join(WORDS[i:i + 6]) + "." for i in range(0, len(WORDS), 3)]] * 3
    workdir = f"gs://{BUCKET}/learned"
    tokenizer, path = inputs.load_or_learn_tokenizer(data, workdir, documents)
    assert path == f"{workdir}/vocab.txt"
    assert json.loads(epath.Path(path + ".json").read_text())["vocab_size"] == 60
    again, _ = inputs.load_or_learn_tokenizer(data, workdir, None)  # read back, not learned again
    assert again.vocab == tokenizer.vocab
    assert not pathlib.Path("gs:").exists()


def test_paths_and_old_absolute_vocabularies(tmp_path):
    assert files.join("gs://b/run/", "checkpoints") == "gs://b/run/checkpoints"
    assert files.join(str(tmp_path), "x") == os.path.join(str(tmp_path), "x")
    assert workdirs.resolve_vocabulary("vocab.txt", "gs://b/run") == "gs://b/run/vocab.txt"
    assert workdirs.resolve_vocabulary("/old/place/vocab.txt", "gs://b/run") == "/old/place/vocab.txt"
    with pytest.raises(ValueError, match="cannot write to the workdir foo://b/run"):
        files.make("foo://b/run")


WORDS = ("the river city north old museum built century king village church music long bridge water "
         "school road first new large small known several people many early later during because").split()


def _corpus(root: pathlib.Path) -> pathlib.Path:
    from bertjax.text import vocab_learning as vocab

    rng = np.random.default_rng(0)
    lines = []
    for _ in range(120):
        for _ in range(rng.integers(1, 8)):
            lines.append(" ".join(rng.choice(WORDS, size=rng.integers(4, 14))).capitalize() + ".")
        lines.append("")
    (root / "corpus.txt").write_text("\n".join(lines))
    vocab.learn_wordpiece_vocab((line for line in lines if line), 150, True, str(root / "vocab.txt"))
    return root


def _train(corpus, workdir):
    """The run `python -m bertjax.train` makes of a small config on the corpus, in this process (where the
    emulator's environment is set)."""
    from bertjax.runs import pretraining

    pretraining.pretrain(tiny_config({
        "data.source": "text", "data.input_pattern": str(corpus / "corpus.txt"),
        "data.vocab_path": str(corpus / "vocab.txt"), "data.eval_fraction": 0.1, "data.max_seq_length": 32,
        "data.max_predictions_per_seq": 5, "model.vocab_size": 160, "model.hidden_size": 32, "model.num_heads": 2,
        "model.num_layers": 1, "model.intermediate_size": 64, "train.batch_size": 8, "train.num_steps": 6,
        "schedule.warmup_steps": 2, "logging.log_every": 1, "logging.eval_every": 3, "logging.eval_batches": 1,
        "checkpoint.every_steps": 4}), workdir)


@pytest.mark.slow
def test_train_resume_load_on_gcs_then_copy_the_workdir(gcs, tmp_path, capsys, monkeypatch):
    import bertjax
    from etils import epath

    corpus = _corpus(tmp_path)
    workdir = f"gs://{BUCKET}/run"
    remote = epath.Path(workdir)

    def metrics():
        return [json.loads(line) for line in (remote / "metrics.jsonl").read_text().splitlines()]

    monkeypatch.chdir(tmp_path)  # where a gs:// path taken for a local one would land
    _train(corpus, workdir)
    losses = {r["step"]: r["loss"] for r in metrics() if "split" not in r}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    # A run that logged steps 5 and 6 but died before saving them: resume from 4.
    (remote / "checkpoints" / "6").rmtree()
    capsys.readouterr()
    _train(corpus, workdir)
    assert "resumed from step 4" in capsys.readouterr().out
    train_lines = [r for r in metrics() if "split" not in r]
    assert [r["step"] for r in train_lines] == [1, 2, 3, 4, 5, 6]  # trimmed, then logged again
    assert train_lines[4]["resumed_from"] == 4
    assert all(r["loss"] == losses[r["step"]] for r in train_lines)  # the very same steps

    assert json.loads((remote / "config.json").read_text())["train"]["num_steps"] == 6
    assert list((remote / "tensorboard").glob("events.out.tfevents.*"))
    assert (remote / "vocab.txt").read_bytes() == (corpus / "vocab.txt").read_bytes()
    meta = json.loads((remote / "checkpoints" / "6" / "meta" / "metadata").read_text())
    assert meta["tokenizer"]["path"] == "vocab.txt"  # relative to the workdir
    assert not (remote / "run.lock").exists()
    assert not (tmp_path / "gs:").exists() and not (REPO / "gs:").exists()  # nothing local by mistake

    texts = ["The old bridge was built.", "A museum."]
    expected = bertjax.load(workdir).encode(texts)

    # Copied elsewhere (here: down to a local directory), the old place and the vocabulary given gone.
    copy = tmp_path / "copied"
    for item in _walk(remote):
        target = copy / os.path.relpath(str(item), workdir)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(item.read_bytes())
    remote.rmtree()
    (corpus / "vocab.txt").unlink()
    out = bertjax.load(str(copy)).encode(texts)
    np.testing.assert_array_equal(out["input_ids"], expected["input_ids"])
    np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], rtol=1e-6, atol=1e-6)
    # And once more, as `cp -r` then `rm -r` of the old place.
    moved = tmp_path / "moved"
    shutil.copytree(copy, moved)
    shutil.rmtree(copy)
    out = bertjax.load(str(moved)).encode(texts)
    np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], rtol=1e-6, atol=1e-6)


def _walk(directory):
    """Every file under an epath directory (gs:// listings take one level at a time)."""
    for child in directory.iterdir():
        if child.is_dir():
            yield from _walk(child)
        else:
            yield child


def test_a_workdir_it_cannot_write_is_one_line(tmp_path):
    result = run_command(
        [sys.executable, "-m", "bertjax.train", f"--config={REPO / 'configs' / 'tiny.py'}", "--workdir=foo://b/run",
         "--config.data.source=synthetic"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": FAST_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "cannot write to the workdir foo://b/run" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "foo:").exists()
