"""The README's layout table is the import order: no module imports one listed below it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table_order() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Layout"):readme.index("## Benchmark")]
    order = []
    for line in section.splitlines():
        if line.startswith("| `kevload"):
            for name in re.findall(r"`([\w/.]+)`", line.split("|")[1]):
                name = name.strip("/").removesuffix(".py")
                order.append(("" if name.startswith("kevload") else "kevload/") + name)
    return [name.replace("/", ".") for name in order]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kevload"):
            found.add(node.module)
            if node.module == "kevload":
                found |= {f"kevload.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("kevload")}
    return found


def test_no_module_imports_one_below_it_in_the_layout():
    order = _table_order()
    rank = {name: i for i, name in enumerate(order)}

    def rank_of(module: str) -> int | None:
        while module not in rank and "." in module:
            module = module.rsplit(".", 1)[0]
        return rank.get(module)

    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (ROOT / "kevload").rglob("*.py")}
    unlisted = sorted(m for m in modules if rank_of(m) is None and m not in ("kevload", "kevload.__main__",
                                                                             "kevload.aio"))
    assert unlisted == [], f"modules missing from the README's layout table: {unlisted}"
    upward = sorted((m, d) for m, path in modules.items() for d in _imports(path)
                    if d != "kevload" and rank_of(m) is not None and rank_of(d) is not None
                    and rank_of(d) > rank_of(m))
    assert upward == []
