"""Sphinx configuration of the numpyro-pvi documentation.

Theme and notebooks as ArviZ's site: the PyData theme and MyST-NB, which
renders the tutorials from their stored outputs (``nb_execution_mode =
"off"``) and reads Markdown prose; it needs no pandoc binary (nbsphinx
does), so ``make docs`` works with pip alone. The API reference is generated
from the docstrings (autodoc + autosummary, Sphinx field lists); the prose's
examples run as doctests (``sphinx-build -b doctest``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _compile_fast() -> None:
    """The prose's examples are small: compile them as the test suite does
    (XLA's loop emitters, most optimisations off; ``tutorials/execute.py``
    knows the flag), before JAX starts."""
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    path = ROOT / "tutorials" / "execute.py"
    spec = importlib.util.spec_from_file_location("_tutorials_execute", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.add_fast_compile_flag(os.environ)


os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
_compile_fast()

import numpyro_pvi  # noqa: E402

project = "numpyro-pvi"
author = "numpyro-pvi developers"
copyright = "2026, numpyro-pvi developers"
release = numpyro_pvi.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax served with the site: math renders offline
    "sphinx.ext.viewcode",
    "myst_nb",
]

# -- the tutorials: copied from tutorials/ (their one home) at every build ----
_TUTORIALS = HERE / "tutorials"
for notebook in sorted((ROOT / "tutorials").glob("*.ipynb")):
    target = _TUTORIALS / notebook.name
    if not target.exists() or target.read_bytes() != notebook.read_bytes():
        shutil.copyfile(notebook, target)

nb_execution_mode = "off"  # rendered from the outputs stored in the notebooks
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "substitution"]
myst_heading_anchors = 3
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]

# -- API reference ------------------------------------------------------------
autosummary_generate = True
templates_path = ["_templates"]
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_inherit_docstrings = False  # NumPyro's own docstrings refer to its own pages
autodoc_typehints_format = "short"
autoclass_content = "both"

# -- checks: every warning is an error (make docs passes -W -n) ---------------
nitpicky = True
# Targets in other projects' documentation: this build has no network for
# intersphinx inventories, so references into them are not resolved (they
# render as code); references inside this package must resolve.
_EXTERNAL = (
    r"(jax|jaxlib|numpyro|numpy|np|jnp|xarray|arviz|arviz_base|arviz_stats|"
    r"optax|flowjax|equinox|matplotlib|scipy|pandas|typing|collections|"
    r"types|abc|enum|builtins|dataclasses|functools|tqdm|constraints)(\..*)?"
)
nitpick_ignore_regex = [
    (r"py:.*", _EXTERNAL),
    # builtins and typing forms as they appear in signatures
    (
        r"py:.*",
        r"(Array|ArrayLike|Callable|Sequence|Mapping|Iterable|Any|"
        r"NamedTuple|Protocol|PRNGKey|DataTree|InferenceData|Dataset|"
        r"DataArray|Figure|Axes|Distribution|ELBO|SVI|PyTree|"
        r"Literal|Self|TypeAlias|ParamSpec|TypeVar)",
    ),
    # type variables of generic signatures
    (r"py:class", r"(.*\.)?_T"),
    # private types in the signatures of what a custom score reads
    (r"py:class", r"numpyro_pvi\._trace\..*"),
]
suppress_warnings = ["myst.header"]

# -- doctests: the prose's examples run on small data -------------------------
doctest_test_doctest_blocks = ""  # docstrings' `>>>` sketches are not run
doctest_global_setup = """
import os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import warnings
import jax
import numpy as np
import numpyro
numpyro.set_platform("cpu")
"""

# -- HTML -----------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "numpyro-pvi"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "use_edit_page_button": False,
    "footer_start": ["copyright"],
    # an API entry is one object: the page's width goes to its signature
    # and formulas, not to an "on this page" list of its members
    "secondary_sidebar_items": {"api/generated/*": []},
}
html_sidebars = {"changelog": [], "citing": []}
myst_substitutions = {"release": release}
