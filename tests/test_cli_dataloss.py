"""Bad input and interrupted or failing runs on the command line: one line, a non-zero exit, and no
lost or half-written files (the demo model's cache, --output, --record)."""

from __future__ import annotations

import pytest

from graphtop.models import CheckpointError, demo
from cli_support import assert_usage_error, private_cache_dir, run  # noqa: F401


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\nonce upon a time\n")
    return path


# --- the demo model's cache ------------------------------------------------------------------------


def test_a_cache_dir_under_an_unknown_user_is_one_line_exit_2(tmp_path, prompts, capsys, monkeypatch):
    monkeypatch.setenv("GRAPHTOP_CACHE_DIR", "~graphtop-no-such-user/cache")
    rc, _, err = run(capsys, "--prompts", prompts, "--output", tmp_path / "o.jsonl", "--device", "cpu")
    assert_usage_error(rc, "", err, "GRAPHTOP_CACHE_DIR=~graphtop-no-such-user/cache",
                       "cannot expand ~graphtop-no-such-user")
    assert not (tmp_path / "o.jsonl").exists()


def test_a_disk_that_fills_while_the_weights_are_saved_leaves_no_files(tmp_path, monkeypatch):
    from safetensors import SafetensorError
    import transformers.modeling_utils as modeling_utils

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", full_disk)
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError) as info:
        demo.ensure_demo_model(cache)
    assert str(info.value) == (f"cache folder {cache}: cannot build the demo model: "
                               "Error while serializing: I/O error: No space left on device (os error 28)")
    assert list(cache.iterdir()) == []  # neither the staging folder nor a half-built model
