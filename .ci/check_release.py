"""Build the release and install it the way a user does, away from the source.

Usage: ``python .ci/check_release.py [--keep DIR]``

1. ``python -m build`` makes the sdist and the wheel;
2. their contents are checked: the license and ``py.typed`` are inside; no
   tests, benchmarks, tutorials, documentation sources or data are;
3. the wheel is installed into a fresh virtual environment in a temporary
   directory outside the repository, and the README's quickstart (its code
   blocks, in order) runs there with that environment's Python, from that
   directory — so anything that works only from the source tree fails.

Exits non-zero and says what is wrong otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what must not ship: directories of the repository and data files
FORBIDDEN = re.compile(
    r"(^|/)(tests|benchmarks|tutorials|docs|\.ci)/|\.(csv|npz|npy|nc|json|ipynb|pkl)$"
)
QUICKSTART = "## Quickstart"
#: JAX's persistent compilation cache settings passed on to the quickstart
CACHE_ENV = ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def quickstart() -> str:
    """The README's Python code blocks from its quickstart on (the loss
    swap, choosing λ, the diagnostics), in order, as one script."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(QUICKSTART) :]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    if not blocks:
        raise SystemExit("check_release: the README's quickstart has no code")
    return "\n".join(blocks)


def contents_problems(
    names: list[str], kind: str, required: tuple[str, ...]
) -> list[str]:
    problems = [f"{kind}: ships {n}" for n in names if FORBIDDEN.search(n)]
    for suffix in required:
        if not any(n.endswith(suffix) for n in names):
            problems.append(f"{kind}: {suffix} is missing")
    return problems


def build(outdir: Path) -> tuple[Path, Path]:
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (wheel,) = outdir.glob("*.whl")
    (sdist,) = outdir.glob("*.tar.gz")
    return wheel, sdist


def install_and_run(wheel: Path, work: Path) -> None:
    """Install ``wheel`` into a fresh environment under ``work`` and run the
    quickstart there."""
    env_dir = work / "venv"
    # without a pip of its own: this interpreter's pip installs into it
    # (``--python``), already byte-compiled, where a fresh one would not be
    # (3.7 s + 11.3 s -> 5.0 s)
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        # --no-compile: the quickstart imports a few of the modules pip would
        # byte-compile (jax's thousands among them): 21 s -> 7 s
        [sys.executable, "-m", "pip", "--python", str(python), "install"]
        + ["--quiet", "--no-compile", str(wheel)],
        check=True,
    )
    script = work / "quickstart.py"
    script.write_text(
        "import numpyro_pvi, pathlib, sys\n"
        f"assert pathlib.Path(numpyro_pvi.__file__).is_relative_to({str(env_dir)!r}), "
        "numpyro_pvi.__file__\n" + quickstart(),
        encoding="utf-8",
    )
    subprocess.run(
        [str(python), str(script)],
        check=True,
        cwd=work,
        env={
            "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
            "JAX_PLATFORMS": "cpu",
            "HOME": str(work),
            # the test runs' compilation cache, when they keep one (`make`)
            **{k: v for k, v in os.environ.items() if k in CACHE_ENV},
        },
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="build and install here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="numpyro-pvi-release-") as tmp:
        work = (args.keep or Path(tmp)).resolve()
        if work.is_relative_to(ROOT):
            raise SystemExit(
                "check_release: the work directory must be outside the repository"
            )
        wheel, sdist = build(work / "dist")
        with zipfile.ZipFile(wheel) as z:
            problems = contents_problems(
                z.namelist(), wheel.name, ("numpyro_pvi/py.typed", "licenses/LICENSE")
            )
        with tarfile.open(sdist) as t:
            problems += contents_problems(
                t.getnames(), sdist.name, ("numpyro_pvi/py.typed", "/LICENSE")
            )
        for problem in problems:
            print(f"check_release: {problem}", file=sys.stderr)
        if problems:
            return 1
        install_and_run(wheel, work)
        print(
            f"check_release: {wheel.name} and {sdist.name}: contents as they "
            "should be; the quickstart runs from a fresh environment"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
