"""README.md, executed: every fenced block carries a mark on the line before it saying what this test
does with it, so the README cannot drift from the programs again.

    <!-- readme: runs -->          a sh block's commands run as written, in the README's order, in one
                                   workspace; the Python blocks run in one process, in order, after them
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

import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

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
# Real runs made short: the Quickstart's 600 steps take minutes; 4 steps make a workdir the rest reads.
SHORTER = {
    "bertjax.train": ["--config.train.num_steps=4"],
    "bertjax.finetune": ["--config.train.epochs=0.3"],
}
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


# ---------------------------------------------------------------- parsing, in one process forked per command

# Runs each job in a child forked from a process that has imported the programs the jobs name (importing
# one defines no flag), so that a dry run or a parse costs a fork, not a Python start and its imports. The
# children parse flags and check configs: neither JAX's backend nor TensorFlow runs anything before a fork.
DRIVER = textwrap.dedent(r"""
    import importlib, inspect, json, os, sys, tempfile, traceback
    import bertjax
    from absl import flags
    from bertjax.runs import console
    jobs = json.load(sys.stdin)
    for name in sorted({job["module"] for job in jobs}):
        importlib.import_module(name)
    results = []
    for job in jobs:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.chdir(job["cwd"])
            code = 0
            try:
                name, args = job["module"], job["args"]
                if job["mode"] == "dry run":  # the console script's own entry
                    sys.argv = [name, *args, "--dry_run"]
                    importlib.import_module(name).entry()
                else:
                    module = importlib.import_module(name)
                    # benchmark's flags depend on the command line (its model overrides)
                    wants_argv = inspect.signature(module.define_flags).parameters
                    module.define_flags(*([[name, *args]] if wants_argv else []))
                    if job["mode"] == "flags":  # an inline mention: the flags it names exist
                        for arg in args:
                            flag = arg[2:].split("=")[0] if arg.startswith("--") else None
                            if flag and not flag.startswith("config.") and flag not in flags.FLAGS and not (
                                    flag.startswith("no") and flag[2:] in flags.FLAGS):
                                print(f"{name} has no flag --{flag}", file=sys.stderr)
                                code = 2
                    else:
                        sys.argv = console.with_installed_configs([name, *args])
                        rest = console.parse_flags(sys.argv)[1:]
                        if rest and rest != job["words"][:len(rest)]:
                            print(f"{name}: unexpected arguments {rest}", file=sys.stderr)
                            code = 2
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        results.append(dict(rc=os.waitstatus_to_exitcode(status), out=out.read().decode(), err=err.read().decode()))
    print(json.dumps(results))
""")


def forked(jobs: list[dict], cwd) -> list[dict]:
    for job in jobs:
        job.setdefault("cwd", str(cwd))
        job.setdefault("words", COMMANDS.get(job["module"], []))
    result = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(jobs), capture_output=True, text=True,
                            cwd=cwd, env=environment(), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def environment() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


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


def run(words: list[str], cwd) -> subprocess.CompletedProcess:
    module, args = program(words)
    output = None
    if ">" in args:
        output, args = args[args.index(">") + 1], args[:args.index(">")]
    result = subprocess.run([sys.executable, "-m", module, *args, *SHORTER.get(module, [])], capture_output=True,
                            text=True, cwd=cwd, env=environment(), timeout=600)
    if output and result.returncode == 0:
        (pathlib.Path(cwd) / output).write_text(result.stdout, encoding="utf-8")
    return result


OUTPUT_FLAGS = ("--workdir=", "--to=", "--out=", "--output_dir=")


def run_block(where: str, block_commands: list[list[str]], cwd) -> list[str]:
    """A runs block's commands one after the other; the failures, as lines."""
    for words in block_commands:
        result = run(words, cwd)
        if result.returncode != 0:
            return [f"{where}: {shlex.join(words)}\n{result.stderr[-3000:]}"]
    return []


@pytest.mark.slow
def test_the_readme_runs(tmp_path):
    """Every runs block (a short real pretraining the later commands read from), the dry runs once the
    workdirs they name exist, and every Python block in one process. Blocks run two at a time: one waits
    for each earlier block that writes a path it names (--workdir, --to, --out), and the README's order
    is kept among those."""
    python, dry_runs, running, failures = [], [], [], []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for block in BLOCKS:
            where, mark = f"README.md:{block['line']}", block["mark"]
            if mark.startswith("a file: "):
                path = tmp_path / mark.removeprefix("a file: ").strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block["code"] + "\n", encoding="utf-8")
            elif mark.startswith("runs") and block["language"] == "python":
                python.append((where, substituted(block["code"])))
            elif mark.startswith("runs"):
                block_commands = [words for words in commands(substituted(block["code"])) if not is_install_step(words)]
                for words in block_commands:
                    assert program(words), f"{where}: not a program of bertjax: {shlex.join(words)}"
                named = [word for words in block_commands for word in words]
                for future, outputs in running:
                    if any(out in word for out in outputs for word in named):
                        failures += future.result()
                outputs = {word.split("=", 1)[1] for word in named if word.startswith(OUTPUT_FLAGS)}
                running.append((pool.submit(run_block, where, block_commands, tmp_path), outputs))
            elif mark.startswith("dry run"):
                dry_runs += parse_jobs_of(block, "dry run")
        for future, _ in running:
            failures += future.result()
        assert not failures, "\n".join(failures)
        # Then the dry runs, beside the Python blocks: every workdir and file they name exists now.
        dry = pool.submit(forked, [job for _, job in dry_runs], tmp_path)
        script = "\n".join(f"exec(compile({code!r}, {where!r}, 'exec'), namespace)" for where, code in python)
        result = subprocess.run([sys.executable, "-c", "namespace = {}\n" + script], capture_output=True, text=True,
                                cwd=tmp_path, env=environment(), timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        for (where, job), done in zip(dry_runs, dry.result()):
            assert done["rc"] == 0 and "the config is valid" in done["out"], (
                where, job["module"], job["args"], done["err"][-1500:])
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
