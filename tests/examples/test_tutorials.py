"""Execute every tutorial notebook in smoke mode; a cell error fails the test.

A test process runs its notebooks in one kernel, each after ``%reset -f``
(the committed outputs come from a fresh kernel per notebook:
``python tutorials/execute.py``).

The notebooks read ``NUMPYRO_PVI_SMOKE=1`` to cut optimisation steps and
replications. The committed notebooks carry the outputs of a full run, which
is checked too (every code cell executed, in order, without an error output).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.collector import KERNEL_SETUP

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def _code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text())["cells"]
    return [cell for cell in cells if cell["cell_type"] == "code"]


def test_tutorials_exist():
    assert NOTEBOOKS, f"no notebooks found in {TUTORIALS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_self_contained_and_committed_with_outputs(path):
    source = "\n".join("".join(c["source"]) for c in _code_cells(path))
    assert "NUMPYRO_PVI_SMOKE" in source, f"{path.name} does not read the smoke flag"
    assert "../shared" not in source, f"{path.name} reads data outside the repo"
    counts = [c["execution_count"] for c in _code_cells(path)]
    assert all(n is not None for n in counts), (
        f"{path.name} is committed without outputs; run "
        "`python tutorials/execute.py` on it"
    )
    assert counts == sorted(counts), f"{path.name} cells were run out of order"
    errors = [
        o
        for c in _code_cells(path)
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors, f"{path.name} is committed with an error output"


#: The tutorial that reads ArviZ's containers most: executed once, in the
#: Python 3.12 leg (ArviZ 1.x) when there is one, in the default leg otherwise.
ON_ARVIZ_1 = "06_did_it_work"


def _smoke_param(path: Path):
    # one unit of work per notebook (its own kernel): the two workers share them
    marks = [pytest.mark.slow, pytest.mark.xdist_group(f"notebook-{path.stem}")]
    marks += [pytest.mark.py312_only] if path.stem == ON_ARVIZ_1 else []
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.fixture(scope="module")
def notebook_kernel(tutorial_runner):
    """One kernel per test process runs its notebooks in turn (each after
    ``%reset -f``): the imports and the compilations are made once. It is
    shut down with this module (a kernel that has run the notebooks holds
    gigabytes the rest of the session does not need)."""
    with tutorial_runner.shared_kernel() as km:
        yield km


@pytest.mark.parametrize("path", [_smoke_param(p) for p in NOTEBOOKS])
def test_notebook_executes_in_smoke_mode(path, tutorial_runner, notebook_kernel):
    nb, seconds = tutorial_runner.execute_notebook(
        path, smoke=True, timeout=600, kernel=notebook_kernel, setup=KERNEL_SETUP
    )
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    print(f"{path.name}: smoke run {seconds:.1f} s")
