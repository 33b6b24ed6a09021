"""The package boundaries are checked, not hoped for: import-linter's contracts in pyproject.toml.

CI runs ``lint-imports`` before pytest (.ci/run); this test runs the same contracts in the suite, and
shows each one would catch the import it forbids, by adding that import to the real graph.
"""

from __future__ import annotations

import grimp
import pytest
from support.paths import REPO

importlinter = pytest.importorskip("importlinter")
from importlinter import configuration  # noqa: E402
from importlinter.application import use_cases  # noqa: E402
from importlinter.configuration import settings  # noqa: E402

PYPROJECT = str(REPO / "pyproject.toml")


class _GraphWith:
    """Builds the real import graph, plus one extra import."""

    def __init__(self, importer: str, imported: str) -> None:
        self.importer, self.imported = importer, imported

    def build(
        self, root_package_names, cache_dir, include_external_packages=False, exclude_type_checking_imports=False
    ):
        graph = grimp.build_graph(
            *root_package_names,
            include_external_packages=include_external_packages,
            exclude_type_checking_imports=exclude_type_checking_imports,
            cache_dir=None,
        )
        graph.add_import(importer=self.importer, imported=self.imported, line_number=1, line_contents="import")
        return graph


def _broken(monkeypatch: pytest.MonkeyPatch, extra: "_GraphWith | None" = None) -> list[str]:
    configuration.configure()
    if extra is not None:
        monkeypatch.setitem(settings._config, "GRAPH_BUILDER", extra)
    use_cases._register_built_in_contract_types()
    report = use_cases.create_report(use_cases.read_user_options(PYPROJECT), cache_dir=None)
    return [contract.name for contract, check in report.get_contracts_and_checks() if not check.kept]


def test_the_contracts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _broken(monkeypatch) == []


ENGINE = "The engine (telemetry included) never imports"
LAYERS = "Layers: cli above tui | server (siblings) above engine above models"
TRACE_TOOLS = "The engine's serving path never imports the offline trace tools"


@pytest.mark.parametrize(
    "importer, imported, contracts",
    [
        ("graphtop.engine.trace_tools.stats", "torch", "Telemetry and the pure graph policies import no torch"),
        ("graphtop.engine.graphs.bucket_policy", "graphtop.models", "Telemetry and the pure graph policies"),
        # the quoting rule's one door is engine/arguments.py: telemetry reaching into models for it is refused
        ("graphtop.engine.telemetry.metrics", "graphtop.models.text", "Telemetry and the pure graph policies"),
        ("graphtop.models.text", "torch", "Telemetry and the pure graph policies import no torch"),
        # the dashboard reads traces: importing it would bring the trace tools in too
        ("graphtop.engine.step.loop", "graphtop.tui.state", (ENGINE, LAYERS, TRACE_TOOLS)),
        ("graphtop.engine.telemetry.bus", "textual", ENGINE),
        ("graphtop.engine.telemetry.metrics", "fastapi", ENGINE),
        ("graphtop.engine.engine", "uvicorn", ENGINE),
        ("graphtop.engine.telemetry.metrics", "torch", "Telemetry and the pure graph policies import no torch"),
        ("graphtop.tui.app", "fastapi", "The dashboard imports no FastAPI"),
        ("graphtop.tui.sessions.remote", "uvicorn", "The dashboard imports no FastAPI"),
        ("graphtop.models.decoder", "graphtop.engine.batch", ("Models never import the engine", LAYERS)),
        ("graphtop.models.layers.linear", "triton", "Triton is imported by models.kernels alone"),
        ("graphtop.engine.attention.flashinfer_backend", "triton", "Triton is imported by models.kernels alone"),
        ("graphtop.server.handlers", "triton", "Triton is imported by models.kernels alone"),
        ("graphtop.engine.request", "graphtop.engine.engine", "No import cycles"),
        ("graphtop.engine.graphs.buffers", "graphtop.engine.graphs.runners.base", "No import cycles"),
        ("graphtop.models.spec", "graphtop.models.registry", "No import cycles"),
        ("graphtop.cli.headless", "graphtop.cli.entry", "No import cycles"),
        ("graphtop.server.app", "graphtop.server.server", "No import cycles"),
        ("graphtop.cli.flags", "torch", "The CLI parser imports no torch"),
        ("graphtop.cli.entry", "transformers", "The CLI parser imports no torch"),
        # The layers: each upward import, and one between the two siblings, breaks the one contract.
        ("graphtop.engine.engine", "graphtop.cli.entry", (ENGINE, LAYERS, TRACE_TOOLS)),
        ("graphtop.tui.app", "graphtop.cli.usage", LAYERS),
        ("graphtop.server.server", "graphtop.cli.serve", LAYERS),
        ("graphtop.server.handlers", "graphtop.tui.state", LAYERS),
        ("graphtop.tui.state", "graphtop.server.options", LAYERS),
        ("graphtop.models.kernels.gemv", "graphtop.models.spec", LAYERS),
        ("graphtop.models.text", "graphtop.models.errors", LAYERS),
        # Telemetry split by when it runs: nothing that serves reaches the offline trace tools.
        ("graphtop.engine.step.loop", "graphtop.engine.trace_tools.summary", TRACE_TOOLS),
        # the trace tools read the live schema: an import back is a cycle too
        ("graphtop.engine.telemetry.server", "graphtop.engine.trace_tools.trace", (TRACE_TOOLS, "No import cycles")),
        ("graphtop.engine.graphs.model_runner", "graphtop.engine.trace_tools.stats", TRACE_TOOLS),
        ("graphtop.engine.lifecycle.build", "graphtop.engine.trace_tools.report", TRACE_TOOLS),
    ],
)
def test_each_contract_catches_what_it_forbids(monkeypatch, importer, imported, contracts) -> None:
    expected = (contracts,) if isinstance(contracts, str) else contracts
    broken = _broken(monkeypatch, _GraphWith(importer, imported))
    assert len(broken) == len(expected), broken
    assert all(any(name.startswith(contract) for name in broken) for contract in expected), broken


def test_the_models_layer_is_every_module_of_models_but_kernels() -> None:
    """import-linter takes no layer inside another, so the layers contract lists graphtop.models's modules
    and subpackages one by one, kernels apart: a new one missing there would lie outside every layer."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    named = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    children = {
        "graphtop.models." + (path.stem if path.is_file() else path.name)
        for path in (REPO / "models").iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").exists()
    }
    assert {name for name in named if name.startswith("graphtop.models.")} == children


def test_every_part_of_the_engine_but_the_trace_tools_is_kept_from_them() -> None:
    """The trace-tools contract lists the engine's modules and subpackages one by one (a forbidden
    contract whose source were graphtop.engine would forbid the tools their own imports): a new one
    missing there could import the offline tools unchecked."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (sources,) = [c["source_modules"] for c in contracts if c["name"].startswith(TRACE_TOOLS)]
    children = {
        "graphtop.engine." + (path.stem if path.is_file() else path.name)
        for path in (REPO / "engine").iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").exists()
    }
    assert set(sources) == children - {"graphtop.engine.trace_tools"}


def test_dashboard_model_loads_without_torch() -> None:
    """The dashboard's state and what-if import telemetry and the bucket policy directly: no torch."""
    import subprocess
    import sys

    code = (
        "import sys, graphtop.tui.state, graphtop.tui.whatif, graphtop.engine.trace_tools.summary,"
        " graphtop.engine.trace_tools.report, graphtop.engine.telemetry.recorder, graphtop.engine.kernel_config,"
        " graphtop.engine.telemetry.metrics;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_cli_parser_loads_without_torch() -> None:
    """The contract above sees the parser's own imports; this sees what they load: building every
    parser and parsing a command line import none of the engine's heavy dependencies."""
    import subprocess
    import sys

    code = (
        "import sys, graphtop.cli.flag_types, graphtop.cli.help_text;"
        "from graphtop.cli.advise import build_advise_parser;"
        "from graphtop.cli.entry import build_attach_parser, build_parser, build_ps_parser, build_trace_parser;"
        "from graphtop.cli.flags import _Parser;"
        "from graphtop.cli.serve import build_serve_parser;"
        "build_parser().parse_args(['--synthetic', '2']); build_serve_parser(); build_attach_parser();"
        "build_ps_parser(); build_trace_parser(); build_advise_parser(_Parser);"
        "print(sorted(m for m in ('torch', 'triton', 'transformers', 'flashinfer') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_value_quoting_rule_loads_without_torch() -> None:
    """engine/arguments.py takes its quoting rule from graphtop.models.text, the one copy the models'
    checks share: importing it, and the engine's torch-free parts through it, loads no torch, because
    graphtop.models loads its torch-backed names only when one is asked for."""
    import subprocess
    import sys

    code = (
        "import sys, graphtop.models.text, graphtop.engine.arguments, graphtop.engine.graphs.bucket_list;"
        "import graphtop.models as m; assert not any(n in vars(m) for n in m.__all__);"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_models_package_names_resolve_on_first_use() -> None:
    """graphtop.models's public names load lazily: each one in ``__all__`` has a home, and resolves."""
    import graphtop.models as models

    assert sorted(models.__all__) == sorted(models._HOMES)
    for name in models.__all__:
        assert getattr(models, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        models.nope  # noqa: B018


def test_every_package_folder_is_installed() -> None:
    """pyproject.toml lists the packages by hand (the folders are renamed into graphtop.*): a new
    sub-package missing there works in an editable checkout and is absent from a built wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "graphtop." + ".".join(init.parent.relative_to(REPO).parts)
        for top in ("engine", "models", "tui", "themes", "server", "cli")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert listed == found
