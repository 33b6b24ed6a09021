"""One upload a replay on a real device: pinned ring, one host-to-device copy, one byte scatter, with
device-held sources and strided views in the same send (``-m cuda``)."""

from __future__ import annotations

import torch


def test_sends_in_stream_order_over_many_steps():
    """Each step's contents land before the next step overwrites them, through both pinned buffers,
    across a growth of the staging buffer, and the host never waits on more than a finished copy."""
    from graphtop.engine.graphs.upload import StepUploader, Upload

    dev = torch.device("cuda")
    up = StepUploader(dev)
    ids = torch.zeros(64, dtype=torch.int64, device=dev)
    pages = torch.zeros(5000, dtype=torch.int32, device=dev)
    table = torch.zeros(8, 16, dtype=torch.int64, device=dev)
    seen = []
    for step in range(12):
        n = 3 + step * 400  # grows past the first staging size
        prev = torch.arange(8, device=dev, dtype=torch.int64) * (step + 1)  # "the previous tokens"
        up.send(
            [
                Upload(ids[:8], prev),
                Upload(ids[8:16], torch.full((8,), step, dtype=torch.int64)),
                Upload(pages[:n], torch.arange(n, dtype=torch.int32) + step),
                Upload(table[:2, :3], torch.full((2, 3), -step, dtype=torch.int64)),
            ]
        )
        seen.append((ids[:16].clone(), pages[:n].clone(), table[:2, :3].clone()))  # stream-ordered reads
    torch.cuda.synchronize()
    for step, (i, p, t) in enumerate(seen):
        assert i[:8].tolist() == [k * (step + 1) for k in range(8)] and i[8:].eq(step).all()
        assert torch.equal(p.cpu(), torch.arange(p.numel(), dtype=torch.int32) + step)
        assert t.eq(-step).all()
