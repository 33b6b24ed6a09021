"""The variant manifest: named by everything that decides the variants, written atomically, and a file
that cannot be read or written only means dry runs (never an error)."""

from __future__ import annotations

import os

from graphtop.models.kernels.manifest import VariantManifest
from graphtop.models.kernels.precompile import KernelVariant

A = KernelVariant("graphtop.models.kernels.fused", "_rmsnorm_kernel", '{"key": "a"}')
B = KernelVariant("graphtop.models.kernels.gemv", "_gemv_kernel", '{"key": "b"}')


def test_round_trip_and_what_names_the_file(tmp_path):
    m = VariantManifest(tmp_path, "decode", "setup", [1, 2, 4])
    assert m.variants == [] and m.save([A, B])
    again = VariantManifest(tmp_path, "decode", "setup", [4, 2, 1])  # the same list, in any order
    assert again.path == m.path and again.variants == [A, B]
    others = [
        VariantManifest(tmp_path, "prefill", "setup", [1, 2, 4]),
        VariantManifest(tmp_path, "decode", "another setup", [1, 2, 4]),
        VariantManifest(tmp_path, "decode", "setup", [1, 2, 8]),
    ]
    assert len({o.path for o in others} | {m.path}) == 4 and all(o.variants == [] for o in others)
    assert [p.name for p in m.path.parent.iterdir()] == [m.path.name]  # no staged file left behind


def test_an_unreadable_manifest_is_empty_and_an_unwritable_folder_is_refused_quietly(tmp_path):
    m = VariantManifest(tmp_path, "decode", "setup", [1])
    m.path.parent.mkdir(parents=True)
    m.path.write_text("{not json")
    assert VariantManifest(tmp_path, "decode", "setup", [1]).variants == []
    m.path.write_text('{"variants": [{"module": "m"}]}')  # a field missing
    assert VariantManifest(tmp_path, "decode", "setup", [1]).variants == []
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    assert not VariantManifest(blocked, "decode", "setup", [1]).save([A])
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert not VariantManifest(ro, "decode", "setup", [1]).save([A])
