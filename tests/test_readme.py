"""The README's shape, as a reader new to the package meets it: what it is
for, the two commands, how to install it, the loss swap on a short complete
example, choosing λ, the diagnostics in ArviZ, one table of what is in the
box and where to read more; no speed figures. (Its code runs in
``.ci/check_release.py``, from a fresh environment.)"""

import re
from pathlib import Path

README = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
SECTIONS = [
    "Install",
    "Quickstart: swap the loss",
    "Choose λ by cross-validation",
    "Diagnostics in ArviZ",
    "What is in the box",
    "Read more",
]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_readme_is_short_and_in_the_readers_order():
    assert len(README.splitlines()) <= 150
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings[: len(SECTIONS)] == SECTIONS
    intro = README[: README.index("```")]
    assert "NumPyro" in intro and "loss" in intro  # one sentence of what it is for


def test_the_first_code_block_is_the_two_commands_each_explained():
    first = README[README.index("```") :].split("```")[1]
    lines = [line for line in first.splitlines()[1:] if line.strip()]
    assert [line.split("#")[0].strip() for line in lines] == ["make demo", "make test"]
    assert all(len(line.split("#", 1)[1].strip()) > 10 for line in lines)


def test_install_names_pip_and_the_extras():
    section = README.split("## Install")[1].split("\n## ")[0]
    assert "pip install" in section
    for extra in ("test", "docs", "dev"):
        assert f"`{extra}`" in section or f"[{extra}]" in section


def test_the_loss_swap_is_a_short_complete_example_with_a_held_out_score():
    section = README.split("## Quickstart: swap the loss")[1].split("\n## ")[0]
    (code,) = _blocks(section, "python")
    assert len(code.splitlines()) <= 25
    for name in ("def model", "Trace_ELBO()", "PredictiveELBO(", "predictive_score("):
        assert name in code


def test_lambda_and_the_diagnostics_each_have_an_example():
    for title, names in [
        ("## Choose λ", ("cross_validate(", "cv.best")),
        ("## Diagnostics in ArviZ", ("pareto_k", "az.")),
    ]:
        section = README.split(title)[1].split("\n## ")[0]
        code = "".join(_blocks(section, "python"))
        assert all(name in code for name in names), title


def test_no_speed_figures_or_test_machinery():
    assert not re.search(
        r"\d\s*×|\d\s*ms\b|\bspeed-?up|xdist|compilation cache", README
    )


def test_the_table_has_one_line_per_entry_and_links_reach_the_docs():
    rows = [r for r in README.splitlines() if r.startswith("| `")]
    assert len(rows) >= 10 and all(len(r) < 200 for r in rows)
    for target in re.findall(r"\]\(([^)]+\.md)\)", README):
        assert (Path(__file__).parents[1] / target).is_file(), target
