"""Prove that the repository keeps the shape DESIGN.md gives it.

Checks, from the source and the metadata (nothing is imported):
  * each distribution's in-repo dependencies are exactly those of DESIGN.md (so there is no cycle);
  * each module imports at module level only the standard library, its own package, its declared
    in-repo dependencies and its required third-party packages;
  * anything else (an extra, an optional integration) is imported only inside a function or under
    ``if TYPE_CHECKING:``, and is a declared extra or one of the known optional integrations below;
  * every in-repo version range admits the in-repo version; the meta-package pins current versions;
  * ``.ci/run`` runs exactly the README's test command.
Exit status 1 and one line per problem when anything is off.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import tomllib
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]

DESIGN_GRAPH: dict[str, set[str]] = {
    "accel-state": set(),
    "accel-data": {"accel-state"},
    "accel-bigmodel": {"accel-state"},
    "accel-quant": {"accel-state", "accel-bigmodel"},
    "accel-tracking": {"accel-state"},
    "accel-train": {"accel-state", "accel-data", "accel-bigmodel", "accel-quant", "accel-tracking"},
    "accel-launch": {"accel-state"},
    "accel": {
        "accel-state",
        "accel-data",
        "accel-bigmodel",
        "accel-quant",
        "accel-tracking",
        "accel-train",
        "accel-launch",
    },
}

# Distribution name -> import name, where they differ.
IMPORT_NAME = {
    "pyyaml": "yaml",
    "huggingface-hub": "huggingface_hub",
    "transformer-engine": "transformer_engine",
    "megatron-core": "megatron",
    "comet-ml": "comet_ml",
    "ms-amp": "msamp",
    "lomo-optim": "lomo_optim",
}

# Optional integrations any package may import inside a function, behind an availability check:
# they accelerate or decorate something the package does without them.
OPTIONAL_ANYWHERE = {
    "numpy",
    "tqdm",
    "psutil",
    "rich",
    "IPython",
    "torch_xla",
    "intel_extension_for_pytorch",
    "habana_frameworks",
    "torch_npu",
    "torch_mlu",
    "torch_musa",
    "torch_sdaa",
    "pynvml",
    "packaging",
    "oneccl_bindings_for_pytorch",
    "tensorboardX",
    "pandas",
    "matplotlib",
    "PIL",
    "datasets",
    "peft",
    "lomo_optim",
    "schedulefree",
    "torchvision",
    "triton",
    "msamp",
    "sagemaker",
    "boto3",
    "yaml",
    "import_timer",
    "pytest",
}


def import_name(requirement: str) -> str:
    name = Requirement(requirement).name.lower()
    return IMPORT_NAME.get(name, name.replace("-", "_"))


def load_dists() -> dict[str, dict]:
    dists = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        project = data["project"]
        src = pyproject.parent / "src"
        package = next(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
        about = (src / package / "__about__.py").read_text()
        version = re.search(r'__version__\s*=\s*"([^"]+)"', about)
        requires = [Requirement(r) for r in project.get("dependencies", [])]
        extras = {
            name: [Requirement(r) for r in reqs] for name, reqs in project.get("optional-dependencies", {}).items()
        }
        dists[project["name"]] = {
            "root": pyproject.parent,
            "package": package,
            "version": version.group(1) if version else None,
            "requires": requires,
            "extras": extras,
        }
    return dists


class ImportScanner(ast.NodeVisitor):
    """Collects (module, line, at_top_level) for every import statement of a file."""

    def __init__(self) -> None:
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0

    def _nested(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        test = ast.unparse(node.test)
        if "TYPE_CHECKING" in test:
            self._depth += 1
            self.generic_visit(node)
            self._depth -= 1
        else:
            self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        # `try: import x / except ImportError` at module level is still an import at load time.
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, node.lineno, self._depth == 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.found.append((node.module, node.lineno, self._depth == 0))


def check() -> list[str]:
    problems: list[str] = []
    dists = load_dists()
    packages = {d["package"]: name for name, d in dists.items()}
    stdlib = set(sys.stdlib_module_names)

    for name, dist in dists.items():
        in_repo = {r.name for r in dist["requires"] if r.name in dists}
        if name not in DESIGN_GRAPH:
            problems.append(f"{name}: not a distribution of DESIGN.md")
            continue
        if in_repo != DESIGN_GRAPH[name]:
            problems.append(
                f"{name}: in-repo dependencies {sorted(in_repo)} differ from DESIGN.md {sorted(DESIGN_GRAPH[name])}"
            )
        for req in dist["requires"]:
            if req.name in dists:
                wanted = dists[req.name]["version"]
                if not req.specifier.contains(wanted, prereleases=True):
                    problems.append(f"{name}: requirement '{req}' does not admit the in-repo {req.name} {wanted}")
                if name == "accel" and str(req.specifier) != f"=={wanted}":
                    problems.append(f"accel: must pin {req.name}=={wanted} exactly, has '{req.specifier}'")

        allowed_packages = {dist["package"]} | {dists[d]["package"] for d in DESIGN_GRAPH[name] if d in dists}
        required_third = {import_name(str(r)) for r in dist["requires"] if r.name not in dists}
        extra_third = {import_name(str(r)) for reqs in dist["extras"].values() for r in reqs if r.name not in dists}
        for path in sorted((dist["root"] / "src").rglob("*.py")):
            rel = path.relative_to(ROOT)
            scanner = ImportScanner()
            scanner.visit(ast.parse(path.read_text(), filename=str(path)))
            for module, line, top in scanner.found:
                head = module.split(".")[0]
                where = f"{rel}:{line}"
                if head in stdlib or head == "__future__":
                    continue
                if head in packages:
                    if head not in allowed_packages:
                        problems.append(
                            f"{where}: {dist['package']} may not import {head} (not a dependency in DESIGN.md)"
                        )
                    continue
                if head in required_third:
                    continue
                if top:
                    problems.append(
                        f"{where}: '{module}' is imported at module level but is not a required dependency of {name}; "
                        "import it inside the function that needs it"
                    )
                elif head not in extra_third and head not in OPTIONAL_ANYWHERE:
                    problems.append(f"{where}: '{module}' is neither a dependency nor a declared extra of {name}")

    problems += check_ci_command()
    return problems


def check_ci_command() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- test-command -->\s*```(?:bash|sh)?\n(.+?)\n```", readme, re.S)
    if not match:
        return ["README.md: no test command block marked <!-- test-command -->"]
    command = match.group(1).strip()
    ci = (ROOT / ".ci" / "run").read_text()
    if command not in ci.splitlines():
        return [f".ci/run does not run the README's test command: {command!r}"]
    return []


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem)
    print(f"check_deps: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
