"""The names ``graphtop.engine`` exports resolve (lazily, PEP 562) to the objects their modules define."""

from __future__ import annotations

import pytest

import graphtop.engine as engine_pkg


@pytest.mark.parametrize("name", engine_pkg.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    value = getattr(engine_pkg, name)
    assert value.__name__ == name and value.__module__.startswith("graphtop.engine.")


def test_the_engine_is_one_class_under_both_names() -> None:
    from graphtop.engine.engine import Engine, EngineInfo
    from graphtop.engine.lifecycle.info import EngineInfo as defined

    assert engine_pkg.Engine is Engine and engine_pkg.EngineInfo is EngineInfo is defined
    assert {"submit", "generate", "cancel", "recapture", "wait_for_capture", "close", "shutdown"} <= set(dir(Engine))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        engine_pkg.Nope  # noqa: B018
