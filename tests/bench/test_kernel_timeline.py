"""bench/kernel_timeline.py: overlapping (PDL) kernels are charged only what they add to the step, idle
time is reported as a gap, and a layer's projections are told apart by grid and place."""

from __future__ import annotations

import json

import kernel_timeline as kt


def _k(name: str, ts: float, dur: float, grid=(1, 1, 1)) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": list(grid)}}


def test_overlap_is_not_charged_twice_and_idle_time_is_a_gap():
    evs = [
        _k("_gemv_kernel", 0, 10, (512, 1, 1)),
        _k("_decode_kernel", 6, 10),  # starts 4 us early (PDL): charged 6
        _k("_gemv_kernel", 20, 5, (128, 1, 1)),  # 4 us idle before it
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},  # not a kernel
    ]
    rows = kt.attribute(kt.kernels({"traceEvents": evs}))
    by = {k.split(" ")[0] + k.split(" ", 1)[1].split(" ")[0]: r for k, r in rows.items()}
    assert by["_gemv_kernelgrid=[512,"].advance_us == 10
    assert by["_decode_kernelgrid=[1,"].advance_us == 6
    assert by["_decode_kernelgrid=[1,"].early_us == 4.0
    assert by["_gemv_kernelgrid=[128,"].gap_us == 4 and by["_gemv_kernelgrid=[128,"].advance_us == 5
    assert sum(r.advance_us + r.gap_us for r in rows.values()) == 25  # the span, split exactly


def test_kernels_of_one_name_are_keyed_by_their_place_after_attention(tmp_path):
    evs = []
    t = 0.0
    for _ in range(2):  # two layers: qkv, attention, o, gate_up, down
        for name in ("_gemv_kernel", "_decode_kernel", "_gemv_kernel", "_gemv_kernel", "_gemv_kernel"):
            evs.append(_k(name, t, 1.0, (128, 1, 1)))
            t += 1.0
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    rows = kt.attribute(kt.kernels(json.loads(path.read_text())))
    places = sorted(k.rsplit("@", 1)[-1] for k in rows if "@" in k)
    assert places == ["attn+0", "attn+1", "attn+2", "attn+3", "attn+4"]  # +4: the next layer's qkv
    assert rows["_gemv_kernel grid=[128, 1, 1] @attn+3"].count == 2
    assert rows["_gemv_kernel grid=[128, 1, 1]"].count == 1  # the first qkv: no attention before it
    text = kt.report(path, steps=1)
    assert text.splitlines()[-1].split()[-1] == "10.0"


def test_copies_between_graphs_are_charged_with_the_gap_before_them():
    """A device-to-host copy after a graph's last kernel is device work of its own: its launch gap and
    its duration land on its row, not on the next kernel's."""
    evs = [
        _k("_final_argmax", 0, 2),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 7, "dur": 2, "args": {}},
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Unknown)", "ts": 10, "dur": 1, "args": {}},
        _k("_gemv_kernel", 12, 3, (512, 1, 1)),
    ]
    rows = kt.attribute(kt.kernels({"traceEvents": evs}))
    copy = rows["Memcpy DtoH  grid=[]"]
    assert copy.gap_us == 5 and copy.advance_us == 2
    assert rows["Memset  grid=[]"].gap_us == 1 and rows["Memset  grid=[]"].advance_us == 1
    assert rows["_gemv_kernel grid=[512, 1, 1]"].gap_us == 1
    assert sum(r.advance_us + r.gap_us for r in rows.values()) == 15
