"""Fuzz: command-line flags. Any mix of values for the numeric and list flags is accepted (the run would
go on to load the model) or refused as one ``graphtop: error:`` line with exit status 2."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzz_support import examples, no_hang

import graphtop.cli.headless as headless
from graphtop.cli.entry import main

NUMERIC_FLAGS = (
    "--page-size",
    "--chunked-prefill-size",
    "--max-running-requests",
    "--max-total-tokens",
    "--max-context-len",
    "--mem-fraction-static",
    "--kv-budget-mb",
    "--cuda-graph-max-bs-decode",
    "--cuda-graph-max-num-tokens-prefill",
    "--cuda-graph-max-padding-waste",
    "--synthetic",
    "--synthetic-rate",
    "--seed",
    "--max-new-tokens",
    "--temperature",
    "--top-p",
    "--top-k",
)
TEXT_FLAGS = (
    "--cuda-graph-bs-decode",
    "--cuda-graph-num-tokens-prefill",
    "--synthetic-prompt-len",
    "--synthetic-output-len",
    "--cuda-graph-config",
    "--device",
    "--dtype",
    "--attention-backend",
)
numeric_text = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "0.5",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "1e-400",
            "2147483647",
            "2147483648",
            str(2**63),
            str(2**64),
            "1" + "0" * 5000,
            "",
            " ",
            "0x10",
            "1_000",
            "١٢",
        ]
    ),
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
    st.text(max_size=8),
)
list_text = st.one_of(
    st.sampled_from(
        [
            "1,2,4",
            "1-64:8",
            "8-1",
            "1-100000",
            "0",
            "fixed:0",
            "lognormal:1:1e9",
            "uniform:1:" + "9" * 50,
            "choice:",
            '{"decode": {"bs": [1]}}',
            "{",
            "cuda:99",
            "tpu",
            "float64",
        ]
    ),
    st.text(max_size=16),
)


@settings(max_examples=examples(300))
@given(
    numeric=st.dictionaries(st.sampled_from(NUMERIC_FLAGS), numeric_text, max_size=4),
    text=st.dictionaries(st.sampled_from(TEXT_FLAGS), list_text, max_size=2),
)
def test_flags_are_accepted_or_one_line_exit_2(tmp_path_factory, capsys, numeric, text):
    tmp = tmp_path_factory.mktemp("fuzz")
    prompts = tmp / "p.txt"
    prompts.write_text("hi\n")
    argv = ["--model", str(tmp), "--output", str(tmp / "o.jsonl")]
    if "--synthetic" not in numeric:
        argv += ["--prompts", str(prompts)]
    for flag, value in {**numeric, **text}.items():
        argv.append(f"{flag}={value}")  # '=' keeps a value such as '-1' a value, not a flag
    original = headless._load_engine
    headless._load_engine = lambda *a: (_ for _ in ()).throw(SystemExit(0))  # stop where the model would load
    try:
        with no_hang(10):
            try:
                rc = main(argv)
            except SystemExit as stop:
                rc = stop.code
    finally:
        headless._load_engine = original
    err = capsys.readouterr().err.strip().splitlines()
    if rc == 2:
        assert len(err) == 1 and err[0].startswith("graphtop: error: ") and len(err[0]) < 1000, err
    else:
        assert rc == 0 and err == [], (rc, err)
