"""docs/notebooks/evaluate.ipynb: stored with the outputs of a run (so a reader on GitHub sees its pictures),
and it runs top to bottom on a short tiny pretraining run, its fine-tuned classifier beating the majority
class."""

import html
import pathlib
import re
import sys

import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "notebooks" / "evaluate.ipynb"
# As a user runs it: one CPU device, this checkout's packages, and
# XLA's full optimisation: the notebook's fine-tuning runs hundreds of steps, which cost more unoptimised
# than conftest's quick compiles save.
ENV = {"PYTHONPATH": str(REPO), "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}


def code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def test_the_notebook_is_stored_with_the_outputs_of_one_run():
    """GitHub shows the stored outputs: every code cell ran, once, in order, without an error, and the
    pictures are there. Kept small enough to diff and to load in a browser."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    cells = code_cells(nb)
    assert cells
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    outputs = [output for cell in cells for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3  # curves, attention map, confusion matrix
    assert NOTEBOOK.stat().st_size < 1_500_000
    # The cells' own defaults made them (the README's runs/tiny, the full-size task), not a test's settings.
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert re.search(r"LoadedBert\(\S*/runs/tiny: ", printed) and "1000 training and 300 dev examples" in printed


@pytest.mark.slow
def test_the_evaluation_notebook_runs_on_a_short_tiny_run(tiny_run, tmp_path, monkeypatch):
    """The README's tiny run cut short (conftest's tiny_run: 400 steps, the vocabulary still learned from the
    corpus), then every cell of the notebook in a kernel of this interpreter."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    workdir = tiny_run  # read-only: the notebook reads it and fine-tunes from it into BERTJAX_FINETUNE_DIR
    for name, value in {**ENV, "BERTJAX_WORKDIR": str(workdir), "BERTJAX_FINETUNE_DIR": str(tmp_path / "finetune"),
                        "BERTJAX_NB_TRAIN_EXAMPLES": "300", "BERTJAX_NB_DEV_EXAMPLES": "200",
                        "BERTJAX_NB_EPOCHS": "3", "BERTJAX_NB_QA_EXAMPLES": "100", "BERTJAX_NB_QA_EPOCHS": "2"}.items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    # A kernelspec of its own, naming sys.executable: a "python3" one in the user's Jupyter directories
    # could start another interpreter, without this checkout's packages.
    ipykernel.kernelspec.install(kernel_name="bertjax-test", prefix=str(tmp_path / "jupyter"))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter" / "share" / "jupyter" / "kernels")])
    assert specs.get_kernel_spec("bertjax-test").argv[0] == sys.executable

    nb = nbformat.read(NOTEBOOK, as_version=4)  # executed in memory: the stored outputs stay as they are
    for cell in code_cells(nb):
        cell.outputs, cell.execution_count = [], None
    client = NotebookClient(
        nb, km=KernelManager(kernel_name="bertjax-test", kernel_spec_manager=specs), kernel_name="bertjax-test",
        timeout=300, resources={"metadata": {"path": str(REPO)}},
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if any cell fails
    nbformat.write(nb, tmp_path / "evaluate.ipynb")  # a copy to look at; the stored one is left alone

    outputs = [output for cell in code_cells(nb) for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    found = re.search(r"fine-tuned dev accuracy: ([0-9.]+) \(majority class ([0-9.]+)\)", printed)
    assert found, printed[-2000:]
    accuracy, majority = map(float, found.groups())
    assert accuracy > majority, (accuracy, majority)
    assert any("image/png" in o.get("data", {}) for o in outputs)
    # The question-answering cell: the answer, highlighted in its context, is a piece of that context.
    answer = re.search(r"answer: (.*)  \(probability", printed)
    highlighted = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {}) and "<mark>" in
                   o["data"]["text/html"]]
    assert answer and len(highlighted) == 1
    assert re.search(r"<mark><b>(.*)</b></mark>", highlighted[0]).group(1) == html.escape(answer.group(1))
