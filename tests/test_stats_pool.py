"""Statistics asked for on one of the statistics pool's own threads run there, never waiting on the pool."""

from __future__ import annotations

from concurrent.futures import wait
from pathlib import Path

import torch

from ckpt_tui.core.readers.open import open_checkpoint
from ckpt_tui.core.values import stats


def test_stats_on_every_pool_thread_at_once_do_not_wait_for_the_pool(tmp_path: Path) -> None:
    path = tmp_path / "big.pth"
    values = torch.arange(40_000, dtype=torch.float32)
    torch.save({"w": values}, path)
    tensor = open_checkpoint(path).root["w"]
    pool = stats.worker_pool()
    assert pool is not None
    # every pool thread asks for chunked statistics at once: handed back to the pool, they would wait forever
    futures = [pool.submit(stats.tensor_stats, tensor, chunk=1_000) for _ in range(stats.STATS_THREADS * 2)]
    done, not_done = wait(futures, timeout=60)
    assert not not_done
    for future in done:
        result = future.result()
        assert result.count == 40_000
        assert result.min == 0.0 and result.max == 39_999.0
