"""bench/profile_decode.py's timeline: overlapping (PDL) kernels are charged only what they add to the step, idle
time is reported as a gap, and a layer's projections are told apart by grid and place."""

from __future__ import annotations

import json

import profile_decode as kt


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
    assert text.splitlines()[-2].split()[-1] == "10.0"
    assert text.splitlines()[-1] == "device work items per step: 10.0"


def test_launches_per_layer_and_each_kernels_bandwidth(tmp_path):
    """Two layers of five launches; the q|k|v GEMV (grid [512, 1, 1]) reads 8 MB in 4 us: 2,000 GB/s; the
    attention is matched by name (its split count varies); the o GEMV has no byte count: no figure."""
    evs, t = [], 0.0
    for _ in range(2):
        for name, grid, dur in [
            ("_gemv_kernel", (512, 1, 1), 4.0),
            ("_decode_kernel", (1, 8, 4), 2.0),
            ("_gemv_kernel", (128, 2, 1), 2.0),
            ("_gemv_kernel", (768, 1, 1), 5.0),
            ("_gemv_kernel", (128, 3, 1), 3.0),
        ]:
            evs.append(_k(name, t, dur, grid))
            t += dur
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    launch_bytes = {"_gemv_kernel grid=[512, 1, 1]": 8_000_000, "_decode_kernel": 1_000_000}
    lines = kt.report(path, steps=1, layers=2, launch_bytes=launch_bytes).splitlines()
    assert lines[-1] == "device work items per step: 10.0, 5.00 a layer (2 layers)"
    row = {line.split("  ")[0]: line.split() for line in lines[1:-2]}
    assert row["_gemv_kernel grid=[512, 1, 1] @attn+4"][-1] == "2000"  # the second layer's q|k|v
    assert row["_decode_kernel grid=[1, 8, 4] @attn+0"][-1] == "500"
    assert row["_gemv_kernel grid=[128, 2, 1] @attn+1"][-1].endswith("%")  # no byte count: the share is last


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


def test_profile_decode_knows_what_each_decode_launch_reads():
    """bench/profile_decode.py's byte counts for the timeline (needs Triton for the launch shapes): each
    projection's GEMV by its grid, the one-launch MLP both weights, the attention a layer's K/V."""
    import pytest

    pytest.importorskip("triton")
    import profile_decode
    from support.triton_host import fused_kernels_on_cpu, fused_model

    for fused_mlp in (False, True):
        with fused_kernels_on_cpu():
            model = fused_model("qwen3-0.6b", fused_mlp=fused_mlp, num_hidden_layers=2, vocab_size=2048)
        got = profile_decode.launch_bytes(model, 1, 100)
        mib = 1 << 20
        expected = {
            "_gemv_kernel grid=[512, 1, 1]": 8 * mib,  # q|k|v: 4096 x 1024 bf16
            "_gemv_kernel grid=[128, 2, 1]": 4 * mib,  # o: 1024 x 2048, K split in two
            "_gemv_kernel grid=[256, 1, 1]": 4 * mib,  # the lm_head: 2048 x 1024
            "_decode_kernel": 100 * 8 * 128 * 2 * 2,  # 100 tokens of K and V, 8 KV heads of 128
        }
        if fused_mlp:
            # gate|up 6144 x 1024 and down 1024 x 3072, 16 intermediate columns a program
            expected["_fused_mlp_kernel grid=[192, 1, 1]"] = 18 * mib
        else:
            expected["_gemv_kernel grid=[768, 1, 1]"] = 12 * mib
            expected["_gemv_kernel grid=[128, 3, 1]"] = 6 * mib
        assert got == expected
        assert profile_decode.launch_bytes(model, 5, 100) == {}  # past the fused-GEMV rows


def test_an_unreadable_trace_or_byte_count_file_is_one_line_and_exit_2(tmp_path, capsys):
    import pytest

    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [_k("_gemv_kernel", 0, 1)]}))
    broken = tmp_path / "bytes.json"
    broken.write_text("{not json")
    for argv in (["--timeline", str(tmp_path / "missing.json")], ["--timeline", str(trace), "--bytes", str(broken)]):
        with pytest.raises(SystemExit) as exit_:
            kt.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: ") and "Traceback" not in err
        assert ": error: cannot read the trace or the byte counts: " in err.strip().splitlines()[-1]
    assert kt.main(["--timeline", str(trace)]) == 0
