"""graphtop.engine.trace_tools: what reads a recorded run back, offline; the engine's step path imports none
of it (an import-linter contract in pyproject.toml). No torch."""
