"""One sampling record: ``SamplingParams`` defines the sampling parameters, and every door that carries
them derives from it or names each of its fields. The wire's record (and the dashboard's, which is the
same) is made from its fields; the HTTP API declares each field under its own name unless
``NAMED_OTHERWISE`` says what sets it; a prompts file line takes them by name; the CLI's sampling flags
are fields of it with its defaults. Each check is a function that lists the drift it finds, run on the
real mirror (no drift) and on a drifted copy (the drift is found), so the check cannot pass vacuously.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import msgspec
import pytest
from pydantic import BaseModel, create_model

from graphtop.engine.sampling_params import SamplingParams, sampling_fields
from graphtop.engine.telemetry import protocol as wire

HINTS = get_type_hints(SamplingParams)
DEFAULTS = {f.name: f.default for f in fields(SamplingParams) if f.init and f.default is not MISSING}
SCALARS = (bool, int, float)


def wire_drift(struct: type) -> list[str]:
    """What the wire's sampling struct gets wrong about SamplingParams: a field missing or extra, or of
    another type or default."""
    mine = {f.name: f for f in msgspec.structs.fields(struct)}
    problems = [f"{n}: not on the wire" for n in sampling_fields() if n not in mine]
    problems += [f"{n}: on the wire only" for n in mine if n not in HINTS]
    for name, f in mine.items():
        if name in HINTS and (f.type != HINTS[name] or f.default != DEFAULTS[name]):
            problems.append(f"{name}: {f.type} = {f.default!r} on the wire, {HINTS[name]} = {DEFAULTS[name]!r}")
    return problems


def _plain(annotation: Any) -> Any:
    """``Optional[T]`` -> ``T``."""
    if get_origin(annotation) is Union:
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def server_drift(model: type[BaseModel], named_otherwise: dict[str, str]) -> list[str]:
    """What the request model gets wrong: a sampling field neither declared nor named otherwise, a field
    given a default (left out, it must take SamplingParams' default), or a number or flag of another type
    (a JSON array or object is the engine's to check, whatever the model declares)."""
    problems = []
    for name in sampling_fields():
        declared = model.model_fields.get(name)
        if name in named_otherwise:
            continue
        if declared is None:
            problems.append(f"{name}: not a request field (nor in NAMED_OTHERWISE)")
            continue
        if declared.default is not None:
            problems.append(f"{name}: defaults to {declared.default!r} in the API, not to the engine's default")
        want, got = _plain(HINTS[name]), _plain(declared.annotation)
        if want in SCALARS and got is not want:
            problems.append(f"{name}: {got} in the API, {want} in SamplingParams")
    problems += [f"{n}: named otherwise, but not a sampling field" for n in named_otherwise if n not in HINTS]
    return problems


def test_the_wire_record_is_made_from_sampling_params():
    assert wire_drift(wire.Sampling) == []
    drifted = msgspec.defstruct("Sampling", [("max_new_tokens", int, 64), ("top_k", float, 0.0), ("beam", int, 1)])
    assert wire_drift(drifted) == [
        *(f"{n}: not on the wire" for n in sampling_fields() if n not in ("max_new_tokens", "top_k")),
        "beam: on the wire only",
        "max_new_tokens: <class 'int'> = 64 on the wire, <class 'int'> = 128",
        "top_k: <class 'float'> = 0.0 on the wire, <class 'int'> = 0",
    ]


def test_the_wire_record_round_trips_every_field_into_sampling_params():
    values = dict(
        max_new_tokens=7,
        min_tokens=2,
        temperature=0.5,
        top_k=4,
        top_p=0.9,
        min_p=0.1,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias=((3, 1.5),),
        seed=11,
        stop=("end",),
        stop_token_ids=(5,),
        include_stop_str_in_output=True,
        ignore_eos=True,
        skip_special_tokens=False,
        detokenize=True,
        logprobs=2,
        prompt_logprobs=1,
    )
    assert set(values) == set(sampling_fields())  # every field, not its default: a dropped one shows
    sent = wire.Submit("r", "x", wire.Sampling(**values), False)
    got = msgspec.msgpack.decode(wire.encoder.encode(sent), type=wire.Submit)
    assert got.sampling.to_params() == SamplingParams(**values)
    assert msgspec.msgpack.decode(wire.encoder.encode(wire.Sampling())) == {}  # defaults are left out


def test_the_wire_record_is_checked_by_sampling_params_rules():
    with pytest.raises(ValueError, match="top_p must be in"):
        wire.Sampling(top_p=0.0).to_params()


def test_the_dashboard_sends_the_wire_record():
    from graphtop.tui.sessions.base import SamplingSettings
    from graphtop.tui.widgets.sampling_row import PARAM_LABELS

    assert SamplingSettings is wire.Sampling
    assert set(PARAM_LABELS) <= set(sampling_fields())  # the row's refusals name real fields


def test_the_api_declares_every_sampling_field():
    from graphtop.server.protocol import NAMED_OTHERWISE, ChatCompletionRequest, CompletionRequest

    for model in (CompletionRequest, ChatCompletionRequest):
        assert server_drift(model, NAMED_OTHERWISE) == []
    model_fields: dict[str, Any] = {
        n: (CompletionRequest.model_fields[n].annotation, None) for n in CompletionRequest.model_fields
    }
    model_fields.pop("min_p")
    model_fields["top_k"] = (Optional[float], None)
    model_fields["ignore_eos"] = (bool, False)
    drifted = create_model("Drifted", **model_fields)
    assert server_drift(drifted, {**NAMED_OTHERWISE, "typical_p": "?"}) == [
        "top_k: <class 'float'> in the API, <class 'int'> in SamplingParams",
        "min_p: not a request field (nor in NAMED_OTHERWISE)",
        "ignore_eos: defaults to False in the API, not to the engine's default",
        "typical_p: named otherwise, but not a sampling field",
    ]


def test_a_prompts_file_line_takes_the_sampling_fields_by_name():
    from graphtop.cli.prompts_file import SAMPLING_FIELDS

    assert SAMPLING_FIELDS == set(sampling_fields()) - {"logprobs", "prompt_logprobs", "detokenize"}


def test_the_cli_sampling_flags_are_fields_with_their_defaults():
    from graphtop.cli.entry import build_parser

    headless = next(g for g in build_parser()._action_groups if g.title == "headless")
    flags = {a.dest: a.default for a in headless._group_actions if isinstance(a, argparse._StoreAction)}
    sampling = {name: default for name, default in flags.items() if name in HINTS}
    assert set(sampling) == {"max_new_tokens", "temperature", "top_p", "top_k", "seed"}
    seed = sampling.pop("seed")  # the run's seed: synthetic requests each take seed + their index
    assert seed == 0 and sampling == {name: DEFAULTS[name] for name in sampling}
