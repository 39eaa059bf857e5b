"""Test setup: one CPU device for every test but those of sharding, which run with eight virtual devices
in a session of their own (tests/mesh_session.py), so that sharding is tested against one device on any
machine; and XLA's CPU backend told to compile quickly.

XLA reads its flags once, when JAX starts, so they must be set before anything imports jax.
"""

import os
import re
import tempfile

import mesh_session  # tests/ is on sys.path under pytest; it imports no JAX

# The tests' models are tiny and take a few steps each, so compiling is most of their time: without
# LLVM's optimisation passes a step compiles in about half the time and runs a few times slower, which
# these shapes never notice; XLA's older fusion emitters (LLVM IR written directly, not through MLIR)
# and one codegen thread (both workers already keep both cores busy) halve what is left
# (docs/performance.md, "The test suite's time"). The results agree to float rounding, not bit for bit,
# so the programs the tests start get these flags too (their ENV): a run compared exactly with another is
# compiled alike. A test that trains for hundreds of steps asks for full optimisation.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")
# One device, as a laptop has: a test pays for no sharding it does not test. The tests marked `mesh` run
# in the mesh session, whose process this variable marks, with eight.
MESH_RESULTS = os.environ.get(mesh_session.RESULTS_ENV, "")
NUM_DEVICES = mesh_session.NUM_DEVICES if MESH_RESULTS else 1
_INHERITED = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                    os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE_FLAGS, ""))  # the mesh session's
os.environ["XLA_FLAGS"] = " ".join(
    f"{_INHERITED} {FAST_COMPILE_FLAGS} --xla_force_host_platform_device_count={NUM_DEVICES}".split())
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# TensorFlow must not grab accelerators or print its start-up banner during the tests.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# One persistent compilation cache for the whole run, shared by both xdist workers and every training
# subprocess they start (which inherit this environment): the many short runs of the same small configs
# compile the same programs, and compiling is most of their time. Every program, however quick to compile:
# a program's first checkpoint alone compiles about a hundred small slicing programs.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"bertjax-tests-jax-cache-{_RUN}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# ----------------------------------------------------------------------------------------------------
# The quick tier: `pytest -m quick`, the edit-test loop (README, "Tests")
# ----------------------------------------------------------------------------------------------------

# Test modules by the package (or concern) they test: at least one for each package of bertjax, chosen by
# their time in the full suite (docs/performance.md, "The test suite's time"). Every test of a listed
# module is in the tier (tests/test_layout.py checks that each package has one).
QUICK_MODULES = {
    "text": ("test_tokenizer", "test_sentences", "test_bpe"),
    "data": ("test_masking_strategies", "test_packing_data", "test_mixture", "test_settings", "test_sources",
             "test_demo"),
    "models": ("test_model", "test_heads", "test_pooling", "test_chunked_mlm_loss", "test_fused_norm",
               "test_blockwise_attention"),
    "training": ("test_optim", "test_flops", "test_writers", "test_batch_warmup"),
    "tasks": ("test_metrics", "test_squad", "test_tagging", "test_tasks", "test_kinds", "test_retrieval",
              "test_demo_tasks"),
    "compression": ("test_compression_report", "test_quantize"),
    "interop": ("test_hf", "test_families"),
    "inference": ("test_api", "test_embeddings"),
    "runs": ("test_configs", "test_phases", "test_pretraining"),
    "bench": ("test_gpu_check",),
    "programs": ("test_layout", "test_named_paths", "test_program_server"),
}
_QUICK = frozenset(name for names in QUICK_MODULES.values() for name in names)


def pytest_itemcollected(item):
    """Marks the quick tier as each test is collected, before -m chooses."""
    if item.path.stem in _QUICK:
        item.add_marker(pytest.mark.quick)


# ----------------------------------------------------------------------------------------------------
# Directories made once per test run: trained workdirs and the like, which several tests read
# ----------------------------------------------------------------------------------------------------

import json  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import filelock  # noqa: E402  (installed with transformers, which the test extra has)
import pytest  # noqa: E402

_SHARED: dict[pathlib.Path, dict] = {}  # this worker's shared directories -> their files as built


def _run_directory(tmp_path_factory) -> pathlib.Path:
    """The directory of this test run that every xdist worker sees: above each worker's own basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _files(path: pathlib.Path) -> dict:
    return {str(p.relative_to(path)): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(path.rglob("*")) if p.is_file()}


def shared_directory(tmp_path_factory, name: str, build) -> pathlib.Path:
    """A directory that build(path) fills once per test run, in whichever xdist worker asks first (under
    a file lock: the other waits, then reads what the first made). Tests only read it; one that would
    change it (resume a workdir, break a checkpoint) copies it first (copy_of). Each worker checks at
    its end that the directory is as built (a test that wrote into it would make the others' results
    depend on the order they ran in)."""
    root = _run_directory(tmp_path_factory)
    path, done = root / f"shared-{name}", root / f"shared-{name}.done"
    asked = time.time()
    with filelock.FileLock(str(root / f"shared-{name}.lock")):
        waited = time.time() - asked
        if waited > 1:  # the other worker was building it: time this worker stood idle
            with open(root / "shared-builds.log", "a") as log:
                log.write(f"{name} waited {waited:.1f}s {os.environ.get('PYTEST_XDIST_WORKER', '')}\n")
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            start = time.time()
            build(path)
            done.write_text(json.dumps(_files(path)))
            with open(root / "shared-builds.log", "a") as log:  # what each took, for whoever times the suite
                log.write(f"{name} {time.time() - start:.1f}s {os.environ.get('PYTEST_XDIST_WORKER', '')}\n")
    _SHARED[path] = json.loads(done.read_text())
    return path


def copy_of(path, destination) -> pathlib.Path:
    """A copy of a shared directory that a test may change."""
    return pathlib.Path(shutil.copytree(path, destination, symlinks=True))


# Which tests share an xdist worker: the tests of a module that use one of its module-scoped fixtures go to
# one worker, so that the fixture is built once, not once on each; and the readers of the costliest shared
# runs go to the worker that builds them, which spares the other worker waiting on the run's lock. Every
# other test is placed on its own, wherever a worker is free. (pytest-xdist's own loadgroup marks this by
# rewriting node ids, which pytest 9 no longer reads; so the workers write the groups to a file of the run
# and the controller's scheduler reads it.)
SHARED_RUN_GROUPS = {"tiny_run": "tiny-run", "qa_run": "span-and-tagging-runs", "tagging_run": "span-and-tagging-runs"}
GROUPS_FILE = "test-groups.json"


def test_group(item) -> str | None:
    if isinstance(item, mesh_session.MeshTest):
        return "mesh-session"  # one pytest process runs them all
    names = getattr(item, "fixturenames", ())
    group = next((g for name, g in SHARED_RUN_GROUPS.items() if name in names), None)
    info = getattr(item, "_fixtureinfo", None)
    if group is None and info and any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values()):
        group = item.nodeid.split("::")[0]
    return group


@pytest.hookimpl(trylast=True)  # after -k and -m have chosen the items
def pytest_collection_modifyitems(config, items):
    root = _run_directory(config._tmp_path_factory)
    if not MESH_RESULTS:
        items[:] = mesh_session.stand_ins(items, root)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # both workers collect the same items: either file will do
        groups = {item.nodeid: group for item in items if (group := test_group(item))}
        written = root / f"{GROUPS_FILE}.{os.environ['PYTEST_XDIST_WORKER']}"
        written.write_text(json.dumps(groups))
        written.replace(root / GROUPS_FILE)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """With -n (xdist's default "load" mode): whole groups as units of work, each other test alone; the
    largest groups first, the single tests after them, each unit to whichever worker is free."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        _groups = None

        def _split_scope(self, nodeid):
            if self._groups is None:  # read once every worker has collected (so has written the file)
                path = _run_directory(config._tmp_path_factory) / GROUPS_FILE
                self._groups = json.loads(path.read_text()) if path.exists() else {}
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def pytest_runtest_logreport(report):
    if MESH_RESULTS:  # the mesh session tells the main one each test's outcome
        mesh_session.record(report, MESH_RESULTS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's span (setup to teardown) on its worker, in the run directory's test-timeline.log: where
    the suite's time goes, idle workers included."""
    start = time.time()
    yield
    with open(_run_directory(item.config._tmp_path_factory) / "test-timeline.log", "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {start:.2f} {time.time():.2f} {item.nodeid}\n")


@pytest.fixture(scope="session", autouse=True)
def _shared_directories_stay_as_built():
    yield
    changed = {}
    for path, built in _SHARED.items():
        now = _files(path)
        if now != built:
            changed[str(path)] = sorted(k for k in set(now) | set(built) if now.get(k) != built.get(k))[:5]
    assert not changed, f"tests changed shared directories (copy one before changing it): {changed}"


# ----------------------------------------------------------------------------------------------------
# Runs as the programs make them, in this process or as a command line
# ----------------------------------------------------------------------------------------------------

import atexit  # noqa: E402
import runpy  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_config(settings: dict, config_file: str = "configs/tiny.py"):
    """A config file's config with settings {"section.key": value} set, as --config.section.key=value
    sets them: what a test runs in this process through bertjax/runs, where config_flags(settings) is
    the same run's command line."""
    config = runpy.run_path(str(REPO / config_file))["get_config"]()
    for key, value in settings.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def one_device_layout(config):
    """(mesh, rules, batch sharding) of one device under the config's rules: the library tests check the
    numbers (the programs run on the mesh session's eight devices)."""
    import jax

    from bertjax.training import sharding

    mesh = sharding.make_mesh(dict(data=1, fsdp=1, tensor=1), jax.devices()[:1])
    rules = sharding.logical_rules(config.logical_axis_rules)
    return mesh, rules, sharding.batch_sharding(mesh, rules)


def config_flags(settings: dict) -> list[str]:
    return [f"--config.{key}={value}" for key, value in settings.items()]


def program_env(**extra) -> dict:
    """The environment of a program a test starts: this process's (its XLA flags, its device count
    and compilation cache), so that the program compiles what a run in this process compiles and the two
    agree bit for bit; this checkout's packages first."""
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


# What the program server imports once for all the commands of a worker (tests/program_server.py).
SERVED_PROGRAMS = ("bertjax.train", "bertjax.finetune", "bertjax.export", "bertjax.evaluate", "bertjax.distill",
                   "bertjax.prune", "bertjax.benchmark", "bertjax.prepare", "bertjax.preview", "bertjax.data.inputs",
                   "bertjax.demo_task")
_server = None


def _program_server():
    global _server
    if _server is None:
        from program_server import ProgramServer

        log = os.path.join(tempfile.gettempdir(), f"bertjax-program-server-{_RUN}-{os.getpid()}.log")
        _server = ProgramServer(program_env(), str(REPO), SERVED_PROGRAMS, log)
        atexit.register(_server.close)
    return _server


# Debugging a test that runs a program: BERTJAX_TESTS_NO_FORK=1 runs every command as its own interpreter,
# exactly as a shell would (a few seconds more per command), so a failure can be read without the server.
NO_FORK = bool(os.environ.get("BERTJAX_TESTS_NO_FORK"))


def run_command(argv: list, *, env=None, cwd=REPO, timeout=300) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True, ...) for a test: `python -m ...` and
    `python -c ...` in a fork of this worker's program server (tests/program_server.py) rather than a new
    interpreter; any other command as itself."""
    if NO_FORK:
        return subprocess.run(list(map(str, argv)), env=env or program_env(), cwd=cwd, timeout=timeout,
                              capture_output=True, text=True)
    return _program_server().run(list(argv), env=env or program_env(), cwd=cwd, timeout=timeout)


def start_command(argv: list, *, env=None, cwd=REPO):
    """subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, ...) likewise: what a test that signals
    a running program starts it with."""
    if NO_FORK:
        return subprocess.Popen(list(map(str, argv)), env=env or program_env(), cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return _program_server().start(list(argv), env=env or program_env(), cwd=cwd)


def run_program(module: str, *args, timeout=300, env=None, cwd=REPO) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", module, *map(str, args)], env=env, cwd=cwd, timeout=timeout)


def wait_for(predicate, proc, timeout=240):
    """Until predicate() holds; fails (with the program's stderr) when the program ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the run")


def train_losses(workdir) -> dict:
    """step -> training loss; a step logged twice (before a kill and after the resume) keeps the last."""
    out = {}
    for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "split" not in record:
            out[record["step"]] = record["loss"]
    return out



def finetune_stopped_then_resumed(config, workdir, stop_at: int) -> None:
    """finetuning.finetune stopped after step `stop_at` (saved, runs.start.Stopped), then run again on its
    workdir: what a preempted fine-tuning run does, in this process."""
    import dataclasses

    import pytest
    from bertjax.runs import finetuning, start

    original = finetuning.hooks
    finetuning.hooks = lambda run, preemption: dataclasses.replace(
        original(run, preemption), should_stop=lambda step: step == stop_at)
    try:
        with pytest.raises(start.Stopped):
            finetuning.finetune(config, str(workdir))
    finally:
        finetuning.hooks = original
    finetuning.finetune(config, str(workdir))

WORDS = ("the river city north old museum built century king village church music long bridge water "
         "school road first new large small known several people many early later during because "
         "however although famous station market island mountain forest garden library tower").split()


def write_word_corpus(root: pathlib.Path, num_docs=200, vocab_size=200) -> pathlib.Path:
    """corpus.txt (sentences of WORDS, a blank line between documents) and a vocab.txt learned from it."""
    import numpy as np

    from bertjax.text import vocab_learning as vocab

    rng = np.random.default_rng(0)
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.integers(1, 10)):
            lines.append(" ".join(rng.choice(WORDS, size=rng.integers(4, 16))).capitalize() + ".")
        lines.append("")
    (root / "corpus.txt").write_text("\n".join(lines))
    vocab.learn_wordpiece_vocab((line for line in lines if line), vocab_size, True, str(root / "vocab.txt"))
    return root


def small_run_settings(corpus: pathlib.Path, **changes) -> dict:
    """The small pretraining run on a word corpus: 12 steps, held-out lines at 6 and 12, checkpoints at
    4, 8 and 12."""
    return {
        "data.source": "text", "data.input_pattern": str(corpus / "corpus.txt"),
        "data.vocab_path": str(corpus / "vocab.txt"), "data.eval_fraction": 0.1, "data.max_seq_length": 32,
        "data.max_predictions_per_seq": 5, "model.vocab_size": 256, "model.hidden_size": 64, "model.num_heads": 2,
        "model.intermediate_size": 128, "train.batch_size": 8, "train.num_steps": 12, "schedule.warmup_steps": 2,
        "logging.log_every": 1, "logging.eval_every": 6, "logging.eval_batches": 2, "checkpoint.every_steps": 4,
        **changes,
    }


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
    """The small pretraining run (small_run_settings), made once per test run in-process as
    `python -m bertjax.train` makes it: {"corpus", "workdir", "settings"}. Read-only: copy_of it to
    resume it, break it or train on."""

    def build(root):
        from bertjax.runs import pretraining

        write_word_corpus(root)
        pretraining.pretrain(tiny_config(small_run_settings(root)), str(root / "run"))

    root = shared_directory(tmp_path_factory, "small-run", build)
    return dict(corpus=root, workdir=root / "run", settings=small_run_settings(root))


TINY_RUN_SETTINGS = {
    # The README's tiny run on the demo corpus (its 8k vocabulary learned from the corpus), cut to 400
    # steps of 32 x 64 to check on every CI run that it learns. One example a row: the packer's CPU would
    # double this run's time on 2 cores; a packed step computes what its examples unpacked would
    # (tests/test_packing_model.py).
    "train.num_steps": 400, "train.batch_size": 32, "data.max_seq_length": 64, "data.max_predictions_per_seq": 10,
    "schedule.warmup_steps": 40, "logging.log_every": 50, "logging.eval_every": 200, "logging.eval_batches": 10,
    "checkpoint.every_steps": 200, "data.packing": False,
}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """`python -m bertjax.train --config=configs/tiny.py` on the demo corpus as a user runs it (one CPU
    device, XLA's full optimisation: 400 steps pay for its compile), made once per test run: its workdir.
    Read-only (the notebook and the learning check read it)."""

    def build(root):
        result = run_program("bertjax.train", "--config=configs/tiny.py", f"--workdir={root / 'tiny'}",
                             *config_flags(TINY_RUN_SETTINGS), timeout=900,
                             env=program_env(XLA_FLAGS="", JAX_PLATFORMS="cpu"))
        assert result.returncode == 0, result.stderr[-3000:]
        (root / "stdout.txt").write_text(result.stdout)

    return shared_directory(tmp_path_factory, "tiny-run", build) / "tiny"


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory):
    """A bertjax 'pretraining' workdir with a small random BERT (H=64, 2 layers), its vocabulary learned
    from the demo corpus, and the keyword task's files (tests/test_finetune.py): {"workdir", "cfg",
    "params", "files", "dev_labels"}. Made once per test run; read-only."""
    import flax.linen as nn
    import jax
    import numpy as np

    from bertjax.data import demo
    from bertjax.models import bert as bert_model
    from bertjax.models.config import BertConfig
    from bertjax.tasks import demo_tasks
    from bertjax.training import checkpoint
    from bertjax.training.checkpoint_meta import CheckpointMeta

    def write_jsonl(path, rows):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")

    def build(root):
        from bertjax.text import vocab_learning as vocabularies

        workdir = root / "pretrained"
        workdir.mkdir()
        sentences = [s for doc in demo.demo_documents(300) for s in doc]
        vocabularies.learn_wordpiece_vocab(iter(sentences), 1000, True, str(workdir / "vocab.txt"))
        vocab_size = len((workdir / "vocab.txt").read_text(encoding="utf-8").splitlines())
        cfg = BertConfig(vocab_size=vocab_size, hidden_size=64, num_layers=2, num_heads=2,
                         intermediate_size=128, max_position_embeddings=64)
        params = bert_model.BertForPreTraining(cfg).init(jax.random.key(0),
                                                         **bert_model.dummy_batch(1, 16, 2))["params"]
        params = jax.tree_util.tree_map(np.asarray, jax.device_get(nn.unbox(params)))
        meta = {"step": 1, "model": cfg.__dict__,
                "tokenizer": {"kind": "wordpiece", "path": "vocab.txt", "lower_case": True}}
        saver = checkpoint.Checkpointer(str(workdir), every_steps=1, keep=1, async_save=False)
        saver.save(1, params, {"count": np.zeros((), np.int32)}, CheckpointMeta.from_json(meta), force=True)
        saver.wait()
        saver.close()
        rows = [{"text": s, "label": label} for s, label in demo_tasks.keyword_examples(0)]
        write_jsonl(root / "train.jsonl", rows[:500])
        write_jsonl(root / "dev.jsonl", rows[500:620])
        write_jsonl(root / "test.jsonl", [{"text": r["text"]} for r in rows[620:]])

    root = shared_directory(tmp_path_factory, "pretrained", build)
    params, meta = checkpoint.restore_params(str(root / "pretrained"))
    files = {"train": str(root / "train.jsonl"), "validation": str(root / "dev.jsonl"),
             "test": str(root / "test.jsonl")}
    dev_labels = [json.loads(line)["label"] for line in (root / "dev.jsonl").read_text(encoding="utf-8").splitlines()]
    return dict(workdir=str(root / "pretrained"), cfg=BertConfig.from_dict(meta.model),
                params=jax.tree_util.tree_map(np.asarray, params), files=files, dev_labels=dev_labels)


def untrained_contrastive_workdir(pretrained, root: pathlib.Path, settings, params: dict) -> str:
    """A fine-tuning workdir's best/ holding params (of `pretrained`'s encoder) as an embedding model of the
    contrastive kind's settings, its records as a run writes them, untrained: what bertjax.load, the export
    and the retrieval suite read."""
    import dataclasses

    from bertjax.training import checkpoint
    from bertjax.training.checkpoint_meta import CheckpointMeta, TaskRecord, TokenizerRecord

    root.mkdir()
    shutil.copyfile(pathlib.Path(pretrained["workdir"]) / "vocab.txt", root / "vocab.txt")
    meta = CheckpointMeta(step=1, model=dataclasses.asdict(pretrained["cfg"]),
                          tokenizer=TokenizerRecord("wordpiece", "vocab.txt", True),
                          task=TaskRecord("contrastive", "contrastive", squad_settings=dataclasses.asdict(settings)),
                          embedding=settings.embedding_record())
    checkpoint.save_params(str(root), checkpoint.BEST_DIR, 1, params, meta)
    return str(root)


def finetune_config(task, pretrained, **data):
    """configs/finetune/<task> from `pretrained`, small: sequences of 48, batches of 16, 1 epoch."""
    from configs.finetune import common as finetune_configs

    config = finetune_configs.finetune_config(task)
    config.train.init_from = pretrained["workdir"]
    config.data.update(max_seq_length=48, **data)
    config.train.update(batch_size=16, epochs=1.0)
    config.optimizer.learning_rate = 1e-3
    config.optimizer.bias_correction = True  # a random small model, a short run: see configs/tiny.py
    config.logging.update(log_every=10, eval_batch_size=32)
    return config


@pytest.fixture(scope="session")
def finetuned(pretrained, tmp_path_factory):
    """The keyword classifier fine-tuned from `pretrained` for 4 epochs of its 500 training examples (125
    steps) in-process as `python -m bertjax.finetune` runs it, made once per test run: {"workdir", "config",
    "summary"}. Read-only: copy_of it to resume or change it."""
    config = finetune_config("classification", pretrained, labels=("no", "yes"), **pretrained["files"])
    config.train.epochs = 4.0

    def build(root):
        from bertjax.runs import finetuning

        finetuning.finetune(config, str(root / "run"))

    workdir = shared_directory(tmp_path_factory, "finetuned", build) / "run"
    return dict(workdir=str(workdir), config=config, summary=json.loads((workdir / "summary.json").read_text()))


# Byte-level BPE (BPETokenizer): text its tokenizers never saw, each a way byte-level BPE can go wrong:
# accents (composed and not), emoji, CJK, spaces and newlines at either end, tabs, runs of spaces.
BPE_HELD_OUT = ["The river flows north of the old city.", "  leading and trailing spaces  ", "Café naïve résumé",
                "cafe\u0301 (a combining accent)", "emoji 🙂🌊 and 👩🏽‍💻!", "line one\nline two\n\n",
                "\ttabs\tand  runs   of spaces", "東京の川 and Ελληνικά", "", " ",
                "UPPER lower MiXeD 1234 3.14159", "don't won't it's"]
BPE_PAIRS = [("The old bridge.", "  A museum of music\n"), ("Café 🙂", "naïve question?"), ("", "only the second")]


def write_bpe_directories(root: pathlib.Path) -> dict:
    """A tiny byte-level BPE learned by the tokenizers library from text written here, saved as transformers
    saves each family's tokenizer beside a small random encoder: roberta/ (RobertaModel, tokenizer.json,
    vocab.json and merges.txt), roberta-files/ (the same without tokenizer.json) and modernbert/
    (ModernBertModel, an OLMo-style tokenizer.json whose template is [CLS] A [SEP] B [SEP])."""
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from test_family_heads import randomize  # every parameter noise, norm scales around 1

    rng = np.random.default_rng(0)
    text = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))).capitalize() + "." for _ in range(300)]
    text += ["Naïve café, résumé; déjà vu!", "Numbers 1, 22 and 333.", "Tabs\tand\nnewlines  here."]
    # A blank line every sixth: documents, for the pretraining stream that reads it too.
    lines = [line if i % 6 else "" for i, line in enumerate(text, 1)]
    (root / "train.txt").write_text("\n".join(lines), encoding="utf-8")

    def learn(specials):
        engine = tokenizers.Tokenizer(tokenizers.models.BPE())
        engine.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        engine.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                 initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
        engine.train([str(root / "train.txt")], trainer)
        return engine

    def save_model(directory, model_class, config):
        torch.manual_seed(0)
        config._attn_implementation = "eager"
        randomize(model_class(config)).save_pretrained(directory)

    roberta = root / "roberta"
    roberta.mkdir()
    engine = learn(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    engine.model.save(str(roberta))  # vocab.json, merges.txt
    transformers.RobertaTokenizer.from_pretrained(str(roberta)).save_pretrained(roberta)
    save_model(roberta, transformers.RobertaModel, transformers.RobertaConfig(
        vocab_size=engine.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, layer_norm_eps=1e-5))
    files_only = copy_of(roberta, root / "roberta-files")
    (files_only / "tokenizer.json").unlink()

    modernbert = root / "modernbert"
    engine = learn(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    engine.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=engine, pad_token="[PAD]", unk_token="[UNK]",
                                         cls_token="[CLS]", sep_token="[SEP]",
                                         mask_token="[MASK]").save_pretrained(modernbert)
    save_model(modernbert, transformers.ModernBertModel, transformers.ModernBertConfig(
        vocab_size=engine.get_vocab_size(), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2,
        pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3))
    return {"roberta": roberta, "roberta-files": files_only, "modernbert": modernbert}


@pytest.fixture(scope="session")
def bpe_directories(tmp_path_factory) -> dict:
    """write_bpe_directories, made once per test run: name -> directory. Read-only."""
    root = shared_directory(tmp_path_factory, "bpe", write_bpe_directories)
    return {name: root / name for name in ("roberta", "roberta-files", "modernbert")}
