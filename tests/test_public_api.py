"""The Python API as documented is the API: docs/architecture.md's list, ``kevload.__all__``, the
names the lazy ``__getattr__`` serves and the ``TYPE_CHECKING`` imports a type checker reads are
one set, and every name imports. Each package that defines public names lists them in its
``__all__``."""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import kevload

ROOT = Path(kevload.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"


def _documented() -> list[str]:
    text = DOC.read_text()
    start = text.index("`kevload/__init__.py` is the Python API")
    listed = text[start : text.index("each imported on first use", start)]
    return re.findall(r"`(\w+)`", listed.partition(":")[2])


def _type_checking_imports() -> dict[str, str]:
    """Each name ``kevload/__init__.py`` imports under ``if TYPE_CHECKING:``, with the module it
    comes from."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.name: node.module or ""
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_documented_api_is_all_of_it() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), documented
    assert set(documented) == set(kevload.__all__)
    assert len(kevload.__all__) == len(set(kevload.__all__))


def test_every_public_name_imports() -> None:
    for name in kevload.__all__:
        assert getattr(kevload, name) is not None, name
    assert kevload.exitcode.for_run is not None
    assert kevload.__version__ == "0.1.0"


def test_a_type_checker_sees_what_the_lazy_getattr_serves() -> None:
    imports = _type_checking_imports()
    assert set(imports) == set(kevload.__all__) - {"__version__"}
    # The same module for each name: the type a checker reads is the object __getattr__ returns.
    assert imports.pop("exitcode") == "kevload.outputs"
    assert imports == kevload._API


def test_each_package_lists_its_public_names_in_all() -> None:
    packages = [ROOT] + [
        Path(kevload.__path__[0], *info.name.split(".")[1:])
        for info in pkgutil.walk_packages(kevload.__path__, "kevload.")
        if info.ispkg
    ]
    assert len(packages) > 8
    for path in packages:
        tree = ast.parse((path / "__init__.py").read_text())
        defined = {
            name
            for node in tree.body
            for name in (
                [node.name]
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                else [t.id for t in node.targets if isinstance(t, ast.Name)]
                if isinstance(node, ast.Assign)
                else []
            )
            if not name.startswith("_")
        }
        name = ".".join(("kevload", *path.relative_to(ROOT).parts))
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        if not defined:
            continue  # a package of modules only: each is imported by its own name
        assert exported is not None, f"{name} defines {sorted(defined)} and has no __all__"
        assert defined <= set(exported), (name, defined - set(exported))
        for public in exported:
            assert hasattr(module, public), (name, public)
