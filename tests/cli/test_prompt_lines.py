"""Prompt lines: a bad line is rejected alone, with its number and why, and every other line is served
and written. Covers the parser (cli/prompts_file.py), the sampling values it checks through
SamplingParams, and one end-to-end run per class through the command line."""

from __future__ import annotations

import json

import pytest
from support.cli_support import SHORT_RUN

from graphtop.cli.entry import main
from graphtop.cli.prompts_file import parse_line, read_prompts
from graphtop.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread", "private_cache_dir")

# (raw JSON line, words the error must contain)
BAD = {
    "seed over 64 bits": ('{"prompt": "a", "seed": 18446744073709551616}', "seed"),
    "seed true": ('{"prompt": "a", "seed": true}', "seed must be an integer"),
    "empty object": ("{}", "no 'prompt' field: a JSON line is"),
    "prompt and messages": ('{"prompt": "a", "messages": [{"role": "user", "content": "hi"}]}', "not both"),
    "chat string": ('{"prompt": "a", "chat": "yes"}', "'chat' must be true or false, got str"),
    "messages not a list": ('{"messages": "hi"}', "'messages' must be a list of messages, got str"),
    "messages empty": ('{"messages": []}', "'messages' is empty"),
    "message role": ('{"messages": [{"role": "bot", "content": "hi"}]}', "message #0: 'role' must be one of"),
    "message content": ('{"messages": [{"role": "user", "content": ["hi"]}]}', "'content' must be a string, got list"),
    "message field": ('{"messages": [{"role": "user", "content": "hi", "tool": 1}]}', "unknown field(s) tool"),
    "message text": ('{"messages": ["hi"]}', "message #0: a message is an object"),
    "messages chat false": ('{"messages": [{"role": "user", "content": "hi"}], "chat": false}', "contradicts"),
    "prompt number": ('{"prompt": 5}', "'prompt' must be a string"),
    "seed float": ('{"prompt": "a", "seed": 1.5}', "seed must be an integer"),
    "seed NaN": ('{"prompt": "a", "seed": NaN}', "NaN is not a finite number"),
    "negative seed": ('{"prompt": "a", "seed": -1}', "seed"),
    "temperature Infinity": ('{"prompt": "a", "temperature": Infinity}', "Infinity is not a finite number"),
    "temperature 1e400": ('{"prompt": "a", "temperature": 1e400}', "temperature must be a finite number"),
    "temperature string": ('{"prompt": "a", "temperature": "0.7"}', "temperature must be a number"),
    "top_p NaN": ('{"prompt": "a", "top_p": NaN}', "NaN"),
    "top_k float": ('{"prompt": "a", "top_k": 1.0}', "top_k must be an integer"),
    "max_new_tokens true": ('{"prompt": "a", "max_new_tokens": true}', "max_new_tokens must be an integer"),
    "max_new_tokens huge": ('{"prompt": "a", "max_new_tokens": 1e20}', "max_new_tokens"),
    "ignore_eos string": ('{"prompt": "a", "ignore_eos": "no"}', "ignore_eos must be true or false"),
    "stop number": ('{"prompt": "a", "stop": 5}', "stop must be a string or a list"),
    "stop object": ('{"prompt": "a", "stop": {"x": 1}}', "stop must be a string or a list"),
    "stop surrogate": ('{"prompt": "a", "stop": ["\\ud800"]}', "valid Unicode"),
    "prompt surrogate": ('{"prompt": "a\\udfff"}', "'prompt' is not valid Unicode"),
    "id object": ('{"prompt": "a", "id": {"x": 1}}', "'id' must be a string or an integer"),
    "id true": ('{"prompt": "a", "id": true}', "'id' must be a string or an integer"),
    "id surrogate": ('{"prompt": "a", "id": "\\ud800"}', "'id' is not valid Unicode"),
    "deep nesting": ('{"prompt": "a", "stop": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "5000-digit int": ('{"prompt": "a", "seed": 1' + "0" * 5000 + "}", "out of range"),
    "repetition_penalty zero": ('{"prompt": "a", "repetition_penalty": 0}', "repetition_penalty must be > 0"),
    "logit_bias key": ('{"prompt": "a", "logit_bias": {"x": 1}}', "logit_bias keys must be token ids"),
    "logprobs": ('{"prompt": "a", "logprobs": 1}', "unknown field(s) logprobs"),
    "array": ("[1, 2]", None),  # plain text: a line that does not start with '{' is a prompt
}


@pytest.mark.parametrize("case", [c for c in BAD if BAD[c][1]])
def test_bad_line_is_one_line_error_naming_the_reason(case):
    raw, needle = BAD[case]
    pl = parse_line(7, raw)
    assert pl.prompt is None and pl.error is not None, pl
    assert pl.error.startswith("line 7: ") and needle in pl.error and "\n" not in pl.error
    assert len(pl.error) < 200


def test_chat_lines_and_conversations_are_accepted():
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\u2028there"}]
    pl = parse_line(2, json.dumps({"messages": conversation, "id": "c", "max_new_tokens": 3}))
    assert (
        pl.error is None and pl.messages == conversation and pl.prompt is None and pl.sampling == {"max_new_tokens": 3}
    )
    assert pl.submitted(chat_by_default=False) == (conversation, True)
    chat = parse_line(3, '{"prompt": "a", "chat": true}')
    plain = parse_line(4, '{"prompt": "a", "chat": false}')
    either = parse_line(5, '{"prompt": "a"}')
    assert chat.submitted(False) == ("a", True) and plain.submitted(True) == ("a", False)
    assert either.submitted(True) == ("a", True) and either.submitted(False) == ("a", False)  # --chat decides
    assert parse_line(6, "plain text").submitted(True) == ("plain text", True)


def test_accepted_sampling_values_build_sampling_params():
    pl = parse_line(
        1,
        json.dumps(
            {
                "prompt": "a",
                "seed": 2**64 - 1,
                "temperature": 1,
                "top_p": 0.5,
                "top_k": 3,
                "stop": "\n",
                "ignore_eos": True,
                "max_new_tokens": 9,
                "id": 12,
            }
        ),
    )
    assert pl.error is None and pl.id == "12"
    params = SamplingParams(**pl.sampling)
    assert (params.seed, params.stop, params.temperature) == (2**64 - 1, ("\n",), 1.0)


def test_every_sampling_field_is_taken_by_name():
    line = {"prompt": "a", "min_p": 0.1, "repetition_penalty": 1.2, "logit_bias": {"3": -5}, "stop_token_ids": [7]}
    pl = parse_line(1, json.dumps({**line, "min_tokens": 2, "skip_special_tokens": False}))
    assert pl.error is None
    params = SamplingParams(**pl.sampling)
    assert (params.min_p, params.logit_bias, params.stop_token_ids, params.min_tokens) == (0.1, ((3, -5.0),), (7,), 2)


def test_line_breaks_inside_json_strings_and_prompts_do_not_split_requests(tmp_path):
    path = tmp_path / "p.jsonl"
    line1 = '{"prompt": "one\u2028request\u0085still one\u2029too", "id": "a"}'  # raw characters, legal JSON
    path.write_text(line1 + "\nplain\u2028text\x0bline\x1cend\r\n", encoding="utf-8")
    lines = read_prompts(str(path))
    assert [pl.id for pl in lines] == ["a", None]
    assert lines[0].error is None and lines[0].prompt == "one\u2028request\u0085still one\u2029too"
    assert lines[1].prompt == "plain\u2028text\x0bline\x1cend" and lines[1].line == 2


def test_duplicate_ids_reject_the_later_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\nline-4 text\n{"prompt": "c", '
        '"id": "line-3"}\n{"bad json\n{"prompt": "d", "id": "line-5"}\n'
    )
    lines = read_prompts(str(path))
    assert [pl.error for pl in lines][:4] == [
        None,
        "line 2: id 'x' is already used by line 1",
        None,
        "line 4: id 'line-3' is already used by line 3",
    ]
    assert lines[4].error.startswith("line 5: malformed JSON")
    assert lines[5].error == "line 6: id 'line-5' is already used by line 5"
    assert [pl.prompt for pl in lines] == ["a", None, "line-4 text", None, None, None]  # rejected: nothing to submit


def test_not_utf8_file_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "p.txt"
    path.write_bytes(b"fine\n\xff\xfe broken\n")
    rc = main(["--prompts", str(path), "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not UTF-8 (line 2" in err[0]


def test_every_bad_line_is_written_with_its_reason_and_the_others_are_served(tiny_ckpt, tmp_path, capsys):
    """The issue's example: one seed that does not fit in 64 bits (or ``true``) used to raise inside
    sampling, exit 1, and write no output file at all."""
    lines = [
        "hello world",
        '{"prompt": "x", "seed": 18446744073709551616, "temperature": 0.8}',
        '{"prompt": "y", "seed": true, "temperature": 0.8}',
        '{"prompt": "tiny temperature", "temperature": 1e-300, "seed": 5}',
        '{"prompt": "a\\ud800"}',
        '{"prompt": "split\u2028not", "id": "ls"}',
        '{"prompt": "z", "top_p": NaN}',
        "the end",
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    rc = main(["--model", str(tiny_ckpt("llama")), "--prompts", str(prompts), "--output", str(out), *SHORT_RUN])
    stdout, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err
    results = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in results] == ["line-1", "line-2", "line-3", "line-4", "line-5", "ls", "line-7", "line-8"]
    rejected = {r["id"]: r["error"] for r in results if r.get("error")}
    assert set(rejected) == {"line-2", "line-3", "line-5", "line-7"}
    assert "seed" in rejected["line-2"] and "seed" in rejected["line-3"] and "NaN" in rejected["line-7"]
    for r in results:
        if r["id"] not in rejected:
            assert r["finish_reason"] in ("length", "eos") and r["token_ids"], r
    assert len(err.strip().splitlines()) == 4 and all(
        e.startswith(f"graphtop: error: {prompts}:line ") for e in err.strip().splitlines()
    )


def test_results_and_their_summary_show_no_terminal_or_bidi_controls(tiny_ckpt, tmp_path, capsys):
    """A prompts file names its requests and the trace path is the user's: an id with a right-to-left
    override or a C1 control was written raw in OUT.jsonl (json leaves both as they are), where ``cat`` or
    ``--output /dev/stdout`` showed them to the terminal, and the trace's line in the run's summary
    printed its path raw. Now the results escape them (the same values for a JSON reader) and the summary
    shows stand-ins."""
    sly = "evil\u202etxt.exe\u009b2J\u2068"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello", "id": sly}) + "\nplain\n", encoding="utf-8")
    out, trace = tmp_path / "out.jsonl", tmp_path / f"{sly}.jsonl"
    rc = main(
        [
            "--model",
            str(tiny_ckpt("llama")),
            "--prompts",
            str(prompts),
            "--output",
            str(out),
            "--record",
            str(trace),
            *SHORT_RUN,
        ]
    )
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    raw = out.read_text(encoding="utf-8")
    assert [json.loads(line)["id"] for line in raw.splitlines()] == [sly, "line-2"]
    assert "evil\\u202etxt.exe\\u009b2J\\u2068" in raw
    assert f"trace {tmp_path}/evil\ufffdtxt.exe\ufffd2J\ufffd.jsonl: " in stdout  # the run's summary
    for text in (raw, stdout, err):
        assert not any(c in text for c in "\u202e\u009b\u2068\x1b"), ascii(text)


def test_a_prompts_file_past_the_limit_is_an_error_not_an_endless_read(tmp_path, monkeypatch):
    from pathlib import Path

    import graphtop.cli.prompts_file as prompts_mod
    from graphtop.cli.prompts_file import PromptsFileError

    monkeypatch.setattr(prompts_mod, "MAX_FILE_BYTES", 1 << 10)
    big = tmp_path / "big.txt"
    big.write_text("hello\n" * 1000)
    for path in [big] + ([Path("/dev/zero")] if Path("/dev/zero").exists() else []):
        with pytest.raises(PromptsFileError, match="larger than"):
            read_prompts(str(path))
    (tmp_path / "ok.txt").write_text("hello\n" * 10)
    assert len(read_prompts(str(tmp_path / "ok.txt"))) == 10
