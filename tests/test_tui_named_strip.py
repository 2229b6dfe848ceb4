"""The header's "p strips it" and the key p agree: p strips the prefix the header's finding names (a Lightning
module's ``net.``), not only the wrapper prefixes it strips on its own."""

from __future__ import annotations

from pathlib import Path

import torch
from builders_tui import cursor_path, header, loaded, settle
from test_hints_frameworks import lightning_checkpoint

from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.dialogs import PreviewScreen


async def test_p_strips_the_prefix_the_header_names_after_x(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    path = lightning_checkpoint(tmp_path, net, "net")
    app = CkptApp(str(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        session = app.session
        assert session is not None
        # x on the state_dict, as the header says, then y
        for _ in range(30):
            if cursor_path(app) == ("state_dict",):
                break
            await settle(pilot, "j")
        await settle(pilot, "x")
        assert isinstance(app.screen, PreviewScreen)
        await settle(pilot, "y")
        await settle(pilot)
        assert "p strips it" in header(app)
        await settle(pilot, "p")
        assert isinstance(app.screen, PreviewScreen), "p must strip the prefix the header names"
        await settle(pilot, "y")
        await settle(pilot)
        assert sorted(app.session.root) == sorted(net.state_dict())
