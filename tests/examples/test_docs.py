"""The documentation's API reference lists every public name.

``make docs`` builds the site (warnings are errors) and runs the prose's
doctests; this test keeps the API pages (``docs/api/*.rst``, grouped by
task) complete, so a public name added to a module's ``__all__`` gets its
generated page.
"""

import importlib
import re
from pathlib import Path

import pytest

API_PAGES = Path(__file__).resolve().parents[2] / "docs" / "api"
PUBLIC_MODULES = (
    "numpyro_pvi",
    "numpyro_pvi.diagnostics",
    "numpyro_pvi.selection",
    "numpyro_pvi.guides",
    "numpyro_pvi.scores",
    "numpyro_pvi.particles",
    "numpyro_pvi.distributions",
    "numpyro_pvi.sharding",
)


def _listed() -> dict[str, set[str]]:
    """Per module (``.. module::`` or ``.. currentmodule::``) of the API
    pages, the names they list."""
    listed: dict[str, set[str]] = {}
    for page in sorted(API_PAGES.glob("*.rst")):
        module = None
        for line in page.read_text(encoding="utf-8").splitlines():
            if match := re.match(r"\.\. (?:current)?module:: (\S+)", line):
                module = match.group(1)
                listed.setdefault(module, set())
            elif module and re.match(r"   [A-Za-z_]\w*$", line):
                listed[module].add(line.strip())
    return listed


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_api_reference_lists_every_public_name(module):
    public = {
        name
        for name in importlib.import_module(module).__all__
        if not name.startswith("__")
        and not (module == "numpyro_pvi" and name in ("guides", "scores", "selection"))
    }
    listed = _listed().get(module)
    assert listed is not None, f"docs/api/ has no section for {module}"
    assert public == listed, (
        f"{module}: missing from docs/api/ {sorted(public - listed)}, "
        f"listed but not public {sorted(listed - public)}"
    )
