"""README.md, executed: every fenced block carries a mark on the line before it saying what this test
does with it, so the README cannot drift from the programs again.

    <!-- readme: runs -->          a sh block's commands run as written (training made short: SHORTER),
                                   in one workspace, after the earlier blocks that write what they read;
                                   the Python blocks run in one process, in order, after them
    <!-- readme: dry run ... -->   each command run with --dry_run (its config and the inputs it names
                                   checked, nothing built)
    <!-- readme: needs WHAT -->    not run (it needs WHAT, which the tests do not have): each command
                                   parsed by its program (its flags, config and config keys, no stray
                                   word); a Python block compiled
    <!-- readme: ci -->            the test command, which must be what .ci/run runs
    <!-- readme: a file: PATH -->  the block's text written to PATH in the workspace
    <!-- readme: not code ... -->  nothing (a listing)

A block without a mark, a mark it does not know, or code indented instead of fenced fails; so does an
inline `python -m bertjax....` that names a program or a flag that does not exist. The workspace starts
empty: `configs/...` resolves to the installed configs, as for a user outside the repository.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from conftest import program_env  # tests/ is on sys.path under pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARK = re.compile(r"<!-- readme: (.+?) -->")
KINDS = ("runs", "dry run", "needs ", "ci", "a file: ", "not code")
# What the README's placeholders stand for here. A Hugging Face BERT directory: the README's own export of
# the Quickstart's model. The distillation teacher and student, which their block only dry-runs: the
# Quickstart's run, so that the commands after them find a workdir.
PLACEHOLDERS = {
    "/models/bert-base-uncased": "exports/tiny-hf",
    "/models/bert-base-cased": "exports/tiny-hf",
    "runs/teacher6": "runs/tiny",
    "runs/student3": "runs/tiny",
}
WORDS = {r"\bDIR\b": "runs/elsewhere"}
# Real runs made short, by the program or by a word of an argument: the Quickstart's 600 steps take minutes;
# 4 steps make a workdir the rest reads. The reranker's commands, the costliest of the retrieval chain: its
# pairs at half the README's length, each test query's first 5 passages rescored instead of 20.
SHORTER = {
    "bertjax.train": ["--config.train.num_steps=4"],
    "bertjax.finetune": ["--config.train.epochs=0.1"],
    "configs/finetune/rerank.py": ["--config.data.max_seq_length=128"],
    "--rerank_with=": ["--rerank_top=5"],
}
# Data made short: the retrieval demo's training and dev pairs, which the README's retrieval chain embeds,
# mines, trains and evaluates on several times over, one command after another, cut to their first lines
# once written.
SHORTER_DATA = {"--task=retrieval": (("data/retrieval/train.jsonl", 640), ("data/retrieval/dev.jsonl", 48))}
# The programs that take a word besides their flags.
COMMANDS = {"bertjax.evaluate": ["compress"], "bertjax.vocab": ["train"]}


def readme_blocks(text: str) -> list[dict]:
    """Each fenced block: its language, code, first line number and mark (None when unmarked)."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = lines[i - 1] if i else ""
        mark = MARK.fullmatch(before.strip())
        blocks.append(dict(language=fence[1], code="\n".join(lines[i + 1:end]), line=i + 1,
                           mark=mark[1] if mark else None))
        i = end + 1
    return blocks


def outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def commands(code: str) -> list[list[str]]:
    """A sh block's commands as argument lists: continuation lines joined, comments dropped, a chain of
    `a && b` as its commands, a redirection `> FILE` kept as its two words."""
    out = []
    for line in code.replace("\\\n", " ").split("\n"):
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return out


def substituted(text: str) -> str:
    for placeholder, stand_in in PLACEHOLDERS.items():
        text = text.replace(placeholder, stand_in)
    for word, stand_in in WORDS.items():
        text = re.sub(word, stand_in, text)
    return text


def program(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, arguments) of `python -m bertjax....` or `.venv/bin/python -m ...`; None for another command."""
    if len(words) >= 3 and words[0] in ("python", ".venv/bin/python") and words[1] == "-m":
        return words[2], words[3:]
    return None


def is_install_step(words: list[str]) -> bool:
    return words[:3] == ["python3", "-m", "venv"] or words[:2] == [".venv/bin/pip", "install"]


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def marked(kind: str) -> list[dict]:
    return [b for b in BLOCKS if b["mark"] and b["mark"].startswith(kind)]


# ---------------------------------------------------------------- the marks


def test_every_block_is_fenced_and_marked():
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) > 20
    for block in BLOCKS:
        where = f"README.md:{block['line']}"
        assert block["mark"], f"{where}: a block without a <!-- readme: ... --> mark on the line before it"
        assert block["mark"].startswith(KINDS), f"{where}: unknown mark {block['mark']!r}; one of {KINDS}"
        if block["mark"].startswith(("runs", "dry run", "needs ", "ci")):
            assert block["language"] in ("sh", "python"), f"{where}: a {block['mark']!r} block is sh or python"
    # Code indented four spaces after a blank line is a block too, without a fence to mark.
    indented = re.findall(r"\n\n( {4}\S.*)", outside_fences(text))
    assert not indented, f"indented code blocks, fence and mark them: {indented}"


def test_the_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    (block,) = marked("ci")
    first, *steps = block["code"].strip().split(" && ")
    assert first == "python3 -m venv .venv" and "python3 -m venv .venv || exit 1" in ci
    for step in steps:  # each as .ci/run writes it, character for character
        assert any(line.startswith(step) for line in ci), f"{step!r} is not a line of .ci/run"
    # And the Quickstart's install is the same, without the test extra.
    first = commands(marked("runs")[0]["code"])
    assert first[:2] == [["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", "."]]


# ---------------------------------------------------------------- one process, forked per command

# Runs each job in a child forked from a process that has imported the programs the jobs name (importing
# one defines no flag; the parent starts neither JAX's backend nor a TensorFlow op), so that a command
# costs a fork, not a Python start and the seconds of importing TensorFlow and JAX. A child runs the
# program's console entry, as `python -m` would. Two children at a time; a job starts once the jobs it
# comes after have ended, and is not run when one of them failed.
DRIVER = textwrap.dedent(r"""
    import importlib, inspect, json, os, sys, tempfile, time, traceback
    import bertjax
    from absl import flags
    from bertjax.runs import console
    jobs = json.load(sys.stdin)
    for name in sorted({job["module"] for job in jobs if "module" in job}):
        importlib.import_module(name)

    def child(job):
        os.chdir(job["cwd"])
        name, args = job.get("module"), job.get("args", [])
        if job["mode"] == "python":  # the blocks in one namespace, as a notebook runs its cells
            namespace = {}
            for where, code in job["blocks"]:
                exec(compile(code, where, "exec"), namespace)
        elif job["mode"] in ("run", "dry run"):
            sys.argv = [name, *args] + (["--dry_run"] if job["mode"] == "dry run" else [])
            importlib.import_module(name).entry()
        else:
            module = importlib.import_module(name)
            # benchmark's flags depend on its command line (its model overrides)
            wants_argv = inspect.signature(module.define_flags).parameters
            module.define_flags(*([[name, *args]] if wants_argv else []))
            if job["mode"] == "flags":  # an inline mention: the flags it names exist
                for arg in args:
                    flag = arg[2:].split("=")[0] if arg.startswith("--") else None
                    if flag and not flag.startswith("config.") and flag not in flags.FLAGS and not (
                            flag.startswith("no") and flag[2:] in flags.FLAGS):
                        print(f"{name} has no flag --{flag}", file=sys.stderr)
                        return 2
            else:
                sys.argv = console.with_installed_configs([name, *args])
                rest = console.parse_flags(sys.argv)[1:]
                if rest and rest != job["words"][:len(rest)]:
                    print(f"{name}: unexpected arguments {rest}", file=sys.stderr)
                    return 2
        return 0

    def start(job):
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:
            os.dup2(err.fileno(), 2)
            if job.get("stdout"):
                out = open(os.path.join(job["cwd"], job["stdout"]), "wb")
            os.dup2(out.fileno(), 1)
            try:
                code = child(job)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return pid, out, err

    results, running, started = [None] * len(jobs), {}, set()
    while len(started) < len(jobs) or running:
        for i, job in enumerate(jobs):
            if len(running) == 2:
                break
            after = job.get("after", [])
            if i in started or any(results[j] is None for j in after):
                continue
            started.add(i)
            if any(results[j]["rc"] != 0 for j in after):
                results[i] = dict(rc=-1, out="", err="not run: a command before it failed", seconds=0)
                continue
            pid, out, err = start(job)
            running[pid] = (i, out, err, time.time())
        if running:
            pid, status = os.wait()
            i, out, err, begun = running.pop(pid)
            out.seek(0)
            err.seek(0)
            results[i] = dict(rc=os.waitstatus_to_exitcode(status), out=out.read().decode(errors="replace"),
                              err=err.read().decode(errors="replace"), seconds=round(time.time() - begun, 1))
    print(json.dumps(results))
""")


def forked(jobs: list[dict], cwd, timeout: int = 600) -> list[dict]:
    """The jobs' results (rc, out, err, seconds), in order: see DRIVER."""
    for job in jobs:
        job.setdefault("cwd", str(cwd))
        job.setdefault("words", COMMANDS.get(job.get("module"), []))
    result = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(jobs), capture_output=True, text=True,
                            cwd=cwd, env=program_env(), timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def parse_jobs(kind: str, mode: str) -> list[tuple[str, dict]]:
    """(README.md:line, job) for each program of the blocks of a kind; a block's other commands: none."""
    jobs = []
    for block in marked(kind):
        if block["language"] != "sh":
            continue
        for words in commands(substituted(block["code"])):
            found = program(words)
            if found and found[0].startswith("bertjax"):
                jobs.append((f"README.md:{block['line']}", dict(mode=mode, module=found[0], args=found[1])))
    return jobs


def test_every_command_parses_and_every_inline_one_names_real_flags(tmp_path):
    jobs = parse_jobs("needs ", "parse") + parse_jobs("dry run", "parse") + parse_jobs("runs", "parse")
    inline = re.findall(r"`(python\s+-m\s+bertjax[\w.]*(?:\s[^`]*)?)`", outside_fences(README.read_text("utf-8")))
    for mention in inline:
        words = shlex.split(mention.replace("...", ""))
        jobs.append((f"README.md: `{mention}`", dict(mode="flags", module=words[2], args=words[3:])))
    assert len(jobs) > 40 and len(inline) > 10
    for (where, job), result in zip(jobs, forked([job for _, job in jobs], tmp_path)):
        assert result["rc"] == 0, (where, job["module"], job["args"], result["err"][-1500:])


# ---------------------------------------------------------------- running it

OUTPUT_FLAGS = ("--workdir=", "--to=", "--out=", "--output_dir=")


def run_job(words: list[str]) -> dict:
    """A runs block's command as a job: made short where SHORTER says, `> FILE` as its stdout."""
    module, args = program(words)
    job = dict(mode="run", module=module)
    if ">" in args:
        job["stdout"], args = args[args.index(">") + 1], args[:args.index(">")]
    job["args"] = args + [flag for word, extra in SHORTER.items()
                          if word == module or any(word in arg for arg in args) for flag in extra]
    return job


@pytest.mark.slow
def test_the_readme_runs(tmp_path):
    """Every runs block (a short real pretraining the later commands read from), in one forked driver:
    a block's commands one after the other, after each earlier block that writes a path it names
    (--workdir, --to, --out); then the Python blocks in one process, beside the dry runs, once every
    workdir and file they name exists."""
    jobs, where, python, ran = [], [], [], []
    for block in BLOCKS:
        line, mark = f"README.md:{block['line']}", block["mark"]
        if mark.startswith("a file: "):
            path = tmp_path / mark.removeprefix("a file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block["code"] + "\n", encoding="utf-8")
        elif mark.startswith("runs") and block["language"] == "python":
            python.append((line, substituted(block["code"])))
        elif mark.startswith("runs"):
            block_commands = [words for words in commands(substituted(block["code"])) if not is_install_step(words)]
            for words in block_commands:
                assert program(words), f"{line}: not a program of bertjax: {shlex.join(words)}"
            named = [word for words in block_commands for word in words]
            outputs = {word.split("=", 1)[1] for word in named if word.startswith(OUTPUT_FLAGS)}
            # The last command of each earlier block that writes what this one names.
            after = [last for last, written in ran if any(out in word for out in written for word in named)]
            for k, words in enumerate(block_commands):
                jobs.append(dict(run_job(words), after=after if k == 0 else [len(jobs) - 1]))
                where.append((line, shlex.join(words)))
                for flag, cuts in SHORTER_DATA.items():
                    for path, lines in cuts if flag in words else ():  # cut before the block's next command
                        cut = f"p = {path!r}\nkept = open(p).readlines()[:{lines}]\nopen(p, 'w').writelines(kept)\n"
                        jobs.append(dict(mode="python", blocks=[(line, cut)], after=[len(jobs) - 1]))
                        where.append((line, f"(the test) {path} cut to {lines} lines"))
            ran.append((len(jobs) - 1, outputs))
    everything = list(range(len(jobs)))
    for block in marked("dry run"):
        for line, job in parse_jobs_of(block, "dry run"):
            jobs.append(dict(job, after=everything))
            where.append((line, shlex.join([job["module"], *job["args"]])))
    jobs.append(dict(mode="python", blocks=python, after=everything))
    where.append(("README.md's Python blocks", ""))
    results = forked(jobs, tmp_path, timeout=900)
    for (line, command), job, result in zip(where, jobs, results):
        print(f"{result['seconds']:6.1f} s  {line}  {command[:90]}")
        assert result["rc"] == 0, (line, command, result["err"][-3000:])
        if job["mode"] == "dry run":
            assert "the config is valid" in result["out"], (line, command, result["out"][-500:])
    # TensorBoard, which the tests do not serve: what it would read is there.
    (tensorboard,) = [b for b in marked("needs ") if "tensorboard" in b["code"]]
    logdir = tmp_path / commands(tensorboard["code"])[0][2]
    assert list(logdir.glob("tiny/tensorboard/events.out.tfevents.*")), "no TensorBoard events for the README"
    assert list(logdir.glob("tiny/tensorboard/eval/events.out.tfevents.*"))


def parse_jobs_of(block: dict, mode: str) -> list[tuple[str, dict]]:
    jobs = []
    for words in commands(substituted(block["code"])):
        found = program(words)
        assert found, f"README.md:{block['line']}: not a program of bertjax: {shlex.join(words)}"
        jobs.append((f"README.md:{block['line']}", dict(mode=mode, module=found[0], args=found[1])))
    return jobs


def test_needs_blocks_of_python_compile():
    for block in marked("needs "):
        if block["language"] == "python":
            compile(substituted(block["code"]), f"README.md:{block['line']}", "exec")


def test_every_installed_command_is_named():
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    text = README.read_text(encoding="utf-8")
    missing = [name for name in scripts if f"`{name}`" not in text]
    assert not missing, f"README.md does not name the installed commands {missing}"
