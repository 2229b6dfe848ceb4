"""The browser's report screens (compare, diff, per-layer change, check all): each runs its own worker off
the UI thread, escape cancels it, and each is dismissed with a result the browser acts on. A diff whose
keys match only under a subtree with the wrapper prefix stripped says so, and ``a`` compares that way
(the staged tree, with its edits); ``s`` measures the model's weights first, keys shortened to fit."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from builders_tui import browser, cursor_path, header, loaded, screen_text, settle, status

from ckpt_tui.core.errors import Cancelled
from ckpt_tui.tui.app import CkptApp
from ckpt_tui.tui.screens.check_all import CheckAllScreen
from ckpt_tui.tui.screens.compare import CompareScreen
from ckpt_tui.tui.screens.dialogs import PreviewScreen
from ckpt_tui.tui.screens.diff import DiffScreen
from ckpt_tui.tui.screens.layer_change import LayerChangeScreen
from ckpt_tui.tui.screens.report import ReportScreen

SIZE = (80, 24)
LONG = "module.encoder.layers.0.self_attention.output_projection.weight"
BUFFERS = ("running_mean", "running_var", "num_batches_tracked")

DDP_TRAINING = """
import sys, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.output_projection = nn.Linear(64, 64)

class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attention = Attention()

class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer()])

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.encoder = Encoder()
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        x = self.bn(self.conv(x)).flatten(1)
        return self.head(self.encoder.layers[0].self_attention.output_projection(x))

folder = sys.argv[1]
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
model = DDP(Net())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in (1, 2):
    model(torch.randn(4, 3, 6, 6)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    # the optimizer saved first: the per-layer change still measures the model's weights first
    torch.save(
        {"epoch": epoch, "optimizer_state_dict": optimizer.state_dict(), "model_state_dict": model.state_dict()},
        f"{folder}/epoch{epoch}.pth",
    )
    if epoch == 1:
        torch.save(model.module.state_dict(), f"{folder}/bare.pth")
sys.path.insert(0, sys.argv[2])
from builders import leave_process_group
leave_process_group()
"""


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real DDP run (gloo, one rank on 127.0.0.1): ``epoch1.pth`` and ``epoch2.pth`` training checkpoints
    (``module.`` keys under ``model_state_dict``, AdamW state), and ``bare.pth``, epoch 1's bare state_dict."""
    from test_compare import free_port

    folder = tmp_path_factory.mktemp("ddp")
    script = folder / "train.py"
    script.write_text(DDP_TRAINING)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, str(script), str(folder), tests], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return folder


async def open_report(pilot: Any, key: str, path: Path) -> ReportScreen:
    """Press ``key`` (c or D), give ``path`` and wait for the report."""
    await settle(pilot, key)
    pilot.app.screen.query_one("Input").value = str(path)
    await settle(pilot, "enter")
    screen = pilot.app.screen
    assert isinstance(screen, ReportScreen) and screen.report is not None
    return screen


def body(app: CkptApp) -> str:
    return app.screen.query_one(".dialog-body").content.plain


def section(screen: ReportScreen, heading: str) -> list[tuple[Any, str]]:
    return next([(t, text.plain) for t, text in found] for title, found in screen.sections if title.startswith(heading))


# ---- one finding per fact ----------------------------------------------------------------------------


async def test_the_header_says_the_wrapper_prefix_once_and_info_json_still_lists_it(
    ddp_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ckpt_tui.cli import main

    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        shown = header(app)
        assert shown.count("'module.'") == 1 and "wrapper prefix of the model weights above" not in shown
    assert main(["info", str(ddp_run / "epoch1.pth")]) == 0
    out = capsys.readouterr().out
    assert out.count("start with 'module.'") == 1
    assert main(["info", str(ddp_run / "epoch1.pth"), "--json"]) == 0
    kinds = [finding["kind"] for finding in json.loads(capsys.readouterr().out)["findings"]]
    assert "inner-state-dict" in kinds and "prefix" in kinds


# ---- a diff that understands wrappers ---------------------------------------------------------------


async def test_a_ddp_training_checkpoint_diffed_with_the_bare_model_offers_the_realigned_compare(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "D", ddp_run / "bare.pth")
        assert isinstance(screen, DiffScreen)
        said = " ".join(body(app).split())
        assert said.startswith("DIFFERENT")
        assert "the keys match under ckpt[\"model_state_dict\"] with 'module.' stripped in A" in said
        assert "a compares that way here" in said
        assert "a: compare that way" in screen_text(app)
        # each heading counts the keys its rows stand for (core's count: a folded row holds several)
        assert f"only in A ({len(screen.report.only_a)})" in screen_text(app)
        await settle(pilot, "a")
        assert app.screen is screen
        assert body(app).startswith("identical: 11 tensors bit-for-bit equal")
        assert "'module.' stripped" in screen.title_text and "a: compare" not in screen_text(app)


async def test_the_realigned_diff_compares_the_staged_tree_not_the_file_on_disk(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict", "module.head.bias"), None))
        await settle(pilot, "d", "y")
        assert app.session.unsaved == 1
        screen = await open_report(pilot, "D", ddp_run / "bare.pth")
        await settle(pilot, "a")
        assert body(app).startswith("DIFFERENT")
        assert section(screen, "only in B") == [(None, "head.bias")]
        assert "only in A" not in [title for title, found in screen.sections if found]


async def test_after_p_the_diff_offers_the_subtree_alone(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "p", "y")  # strip 'module.' in the staged tree
        screen = await open_report(pilot, "D", ddp_run / "bare.pth")
        assert 'under ckpt["model_state_dict"] in A' in " ".join(body(app).split())
        await settle(pilot, "a")
        assert body(app).startswith("identical")
        assert screen.title_text.startswith('Diff epoch1.pth (under ckpt["model_state_dict"]) with bare.pth')


async def test_two_epochs_diffed_say_so_once_and_list_parameters_first(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch2.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "D", ddp_run / "epoch1.pth")
        said = " ".join(body(app).split())
        assert "all 35 tensors differ in value (8 parameters, 2 buffers, 1 counter, 24 optimizer state)" in said
        assert "two points of one training run" in said and "same keys, shapes and dtypes" in said
        titles = [title for title, rows in screen.sections if rows and title.startswith("value changes")]
        # the long keys' shared start is said once in the title, where the rows need the room
        assert titles == [
            "value changes: model parameters, under model_state_dict/module.",
            "value changes: buffers",
            "value changes: counters",
            'value changes: optimizer state, under ckpt["optimizer_state_dict"]["state"]',
        ]
        assert "NOT close" not in screen_text(app)
        [(_, counter)] = section(screen, "value changes: counters")
        assert counter.endswith("num_batches_tracked: max |a-b| 1")


async def test_a_row_of_the_realigned_diff_jumps_to_the_key_in_the_tree(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch2.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "D", ddp_run / "bare.pth")
        await settle(pilot, "a")
        changed = section(screen, "value changes")
        assert changed and all(key is not None and not key.startswith("module.") for key, _ in changed)
        listed = screen.query_one("#report-list")
        listed.highlighted = next(i for i, target in enumerate(screen.targets) if target == "head.weight")
        await settle(pilot, "enter")
        assert app.screen is browser(app)
        assert cursor_path(app) == ("model_state_dict", "module.head.weight")


async def test_s_measures_the_model_weights_first_with_keys_shortened_to_fit(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", ddp_run / "epoch2.pth")
        await settle(pilot, "s")
        screen = app.screen
        assert isinstance(screen, LayerChangeScreen) and screen.report is not None
        assert "median relative change of the parameters" in body(app)
        keys = [key for key, _ in section(screen, "per layer")]
        parameters = [key for key in keys[:8] if key.startswith("model_state_dict/module.")]
        assert len(parameters) == 8 and all("running" not in key and "num_batches" not in key for key in parameters)
        assert keys[8:11] == [f"model_state_dict/module.bn.{name}" for name in BUFFERS]
        # the optimizer's state is listed apart from the model's layers
        assert len(keys) == 11
        apart = [key for key, _ in section(screen, "optimizer state and other tensors")]
        assert apart and all(key.startswith('ckpt["optimizer_state_dict"]') for key in apart)
        width = screen.query_one("#report-list").scrollable_content_region.width
        most = section(screen, "moved most")
        assert most and all(len(text) <= width for _, text in most)
        long = next(text for key, text in most if key.endswith(LONG))
        # shortened: components to their initials, the layer number and the parameter kept
        assert not long.startswith(f"model_state_dict/{LONG}") and ".0.self_attention" in long
        assert "output_projection.weight: " in long and "(cosine " in long
        # the row still jumps to the whole key
        listed = screen.query_one("#report-list")
        listed.highlighted = next(i for i, t in enumerate(screen.targets) if t == f"model_state_dict/{LONG}")
        await settle(pilot, "enter")
        assert cursor_path(app) == ("model_state_dict", LONG)


async def test_the_compare_report_offers_the_ema_alternative_and_e_applies_it(tmp_path: Path) -> None:
    """As check --against prints it: the alternative (the EMA weights) with its command, and a key for it."""
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    ema = AveragedModel(model).state_dict()
    torch.save({"model": model.state_dict(), "ema": ema, "step": 3}, tmp_path / "run.pth")
    torch.save(model.state_dict(), tmp_path / "ref.pth")
    app = CkptApp(str(tmp_path / "run.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "c", tmp_path / "ref.pth")
        text = " ".join(body(app).split())
        assert "alternative (EMA weights): after extract ema" in text and "e applies it instead" in text
        command = " ".join(text for _, text in section(screen, "alternative (EMA weights)"))
        assert "--extract ema --drop n_averaged --strip-prefix module." in command
        await settle(pilot, "e")
        assert isinstance(app.screen, PreviewScreen)
        await settle(pilot, "y")
        assert app.session is not None and sorted(app.session.root) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert "applied: after extract ema and drop 'n_averaged'" in status(app)


async def test_w_swaps_the_sides_of_a_diff_and_its_per_layer_change(tmp_path: Path) -> None:
    """Diffing the open file against an earlier one reads better the other way round: w takes the other file
    as A (the changes relative to it), and s measures that way too."""
    torch.save({"w": torch.ones(4) * 2}, tmp_path / "late.pth")
    torch.save({"w": torch.ones(4)}, tmp_path / "early.pth")
    app = CkptApp(str(tmp_path / "late.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", tmp_path / "early.pth")
        assert app.screen.title_text == "Diff late.pth with early.pth"
        await settle(pilot, "w")
        screen = app.screen
        assert isinstance(screen, ReportScreen) and screen.report is not None
        assert screen.title_text == "Diff early.pth with late.pth"
        await settle(pilot, "s")
        screen = app.screen
        assert isinstance(screen, LayerChangeScreen) and screen.report is not None
        assert screen.title_text == "Per-layer change from early.pth to late.pth"
        # relative to early.pth: |2 - 1| / |1|
        assert section(screen, "per layer")[0][1].split()[1] == "1"
        await settle(pilot, "w")
        assert app.screen.title_text == "Per-layer change from late.pth to early.pth"
        assert section(app.screen, "per layer")[0][1].split()[1] == "0.5"
        # the row still goes to the open file's key
        await settle(pilot, "enter")
        assert cursor_path(app) == ("w",)


@pytest.mark.parametrize("keys", [("a", "s"), ("s",)], ids=["realigned-first", "s-alone"])
async def test_s_measures_the_way_the_keys_match(ddp_run: Path, keys: tuple[str, ...]) -> None:
    """As they are, the keys pair up nothing but the optimizer state: s measures the model's weights."""
    app = CkptApp(str(ddp_run / "epoch2.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", ddp_run / "bare.pth")
        await settle(pilot, *keys)
        screen = app.screen
        assert isinstance(screen, LayerChangeScreen) and screen.report is not None
        assert body(app).startswith("per-layer change: 11 layers compared")
        assert "'module.' stripped" in screen.title_text


# ---- compare: its result is the fix to apply ----------------------------------------------------------


async def test_f_on_the_compare_report_dismisses_with_the_fix_and_the_browser_previews_it(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict",), None))
        screen = await open_report(pilot, "c", ddp_run / "bare.pth")
        assert isinstance(screen, CompareScreen) and body(app).startswith("DOES NOT FIT")
        await settle(pilot, "f")
        assert isinstance(app.screen, PreviewScreen)
        await settle(pilot, "y")
        assert set(app.session.root["model_state_dict"]) == set(torch.load(ddp_run / "bare.pth"))


async def test_f_on_a_fix_that_is_only_an_extract_stages_it(tmp_path: Path) -> None:
    # {"model", "optimizer", "epoch"} against the bare model: "after extract model" renames no key, yet it is the fix
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 1}, tmp_path / "full.pt")
    torch.save(model.state_dict(), tmp_path / "reference.pth")
    app = CkptApp(str(tmp_path / "full.pt"))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "c", tmp_path / "reference.pth")
        await settle(pilot, "f")
        assert isinstance(app.screen, PreviewScreen), status(app)
        await settle(pilot, "y")
        assert set(app.session.root) == set(model.state_dict())


async def test_the_compare_report_offers_no_fix_for_a_file_whose_records_are_missing(tmp_path: Path) -> None:
    """A zip with a storage record gone: no save can write the fix (every record written is read), so the report
    says why, as check --against does, and f stages nothing (it was offered, and the save then refused)."""
    import zipfile

    from builders import ddp_state_dict, tiny_state_dict

    whole = tmp_path / "whole.pth"
    torch.save(ddp_state_dict(), whole)
    cut = tmp_path / "cut.pth"
    with zipfile.ZipFile(whole) as source, zipfile.ZipFile(cut, "w") as target:
        for item in source.infolist():
            if not item.filename.endswith("/data/0"):
                target.writestr(item, source.read(item.filename))
    torch.save(tiny_state_dict(), tmp_path / "plain.pth")
    app = CkptApp(str(cut))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "c", tmp_path / "plain.pth")
        shown = screen_text(app)
        assert "no fix can be saved: 1 storage record is missing from the file" in shown, shown
        assert "f applies it here" not in shown and "ckpt-tui convert" not in shown
        await settle(pilot, "f")
        assert app.screen is screen and not app.session.edited


async def test_the_compare_report_names_the_resized_head_and_what_keeps_its_fresh_init(
    ddp_run: Path, tmp_path: Path
) -> None:
    reference = torch.load(ddp_run / "bare.pth")
    reference["head.weight"], reference["head.bias"] = torch.zeros(5, 64), torch.zeros(5)
    torch.save(reference, tmp_path / "five_classes.pth")
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict",), None))
        screen = await open_report(pilot, "c", tmp_path / "five_classes.pth")
        # the fix's details lead the list; the summary keeps the command
        said = " ".join(text for _, text in section(screen, "suggested fix"))
        assert "head.weight: [3, 64] vs [5, 64]" in said and "head.bias: [3] vs [5]" in said
        assert "keeps the model's fresh init for head.weight, head.bias" in said
        assert "--drop module.head.weight --drop module.head.bias" in " ".join(body(app).split())
        await settle(pilot, "f", "y")
        assert set(app.session.root["model_state_dict"]) == set(reference) - {"head.weight", "head.bias"}


async def test_at_80x24_the_compare_report_with_another_head_shows_the_fix_command_and_a_useful_list(
    ddp_run: Path, tmp_path: Path
) -> None:
    reference = torch.load(ddp_run / "bare.pth")
    reference["head.weight"], reference["head.bias"] = torch.zeros(5, 64), torch.zeros(5)
    torch.save(reference, tmp_path / "five_classes.pth")
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict",), None))
        await open_report(pilot, "c", tmp_path / "five_classes.pth")
        shown = screen_text(app)
        # no zero counts: only what is true and useful
        assert "DOES NOT FIT: no key matches as it is; after the fix 9/11" in shown
        assert "0 shape mismatches, 0 dtype" not in shown
        assert "--strip-prefix module." in shown and "ckpt-tui convert" in shown
        # the fix's details lead the list, and the list shows several rows without scrolling
        listed = app.screen.query_one("#report-list")
        assert listed.size.height >= 6
        assert "head.weight: [3, 64] vs [5, 64]" in shown and "head.bias: [3] vs [5]" in shown


async def test_read_only_the_compare_report_offers_no_fix_and_f_says_why(ddp_run: Path) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"), readonly=True)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict",), None))
        await open_report(pilot, "c", ddp_run / "bare.pth")
        assert "f applies" not in body(app) and "f: apply" not in screen_text(app)
        assert "on the command line:" in body(app)
        await settle(pilot, "f")
        assert app.screen is browser(app) and not app.session.edited
        assert "--readonly" in screen_text(app)


@pytest.mark.parametrize(("key", "task"), [("D", "diff"), ("c", "compare")])
async def test_a_report_that_cannot_be_made_says_why_and_closes(ddp_run: Path, key: str, task: str) -> None:
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, key)
        app.screen.query_one("Input").value = str(ddp_run / "missing.pth")
        await settle(pilot, "enter")
        assert app.screen is browser(app)
        assert any(n.title == f"Cannot {task}" and "missing.pth" in n.message for n in app._notifications)


# ---- each screen's worker: off the UI thread, and escape cancels it ----------------------------------


class Blocking:
    """A stand-in for core's work that waits until the screen's worker is cancelled, noting its thread."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def wait(self, cancelled: Any) -> None:
        self.thread = threading.current_thread()
        self.started.set()
        for _ in range(500):
            if cancelled():
                self.stopped.set()
                raise Cancelled("cancelled")
            threading.Event().wait(0.01)


def by_progress(progress: Any) -> Any:
    """A cancel check made of a progress callback (it raises once the worker is cancelled)."""

    def cancelled() -> bool:
        try:
            progress(0, 1)
        except Cancelled:
            return True
        return False

    return cancelled


async def escape_cancels(app: CkptApp, pilot: Any, fake: Blocking, screen_type: type) -> None:
    assert fake.started.wait(10)
    assert isinstance(app.screen, screen_type)
    assert fake.thread is not None and fake.thread is not threading.main_thread()
    await pilot.press("escape")
    assert fake.stopped.wait(10)
    await settle(pilot)
    assert app.screen is browser(app)


async def test_escape_cancels_the_diff(ddp_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.operations import diff

    fake = Blocking()
    monkeypatch.setattr(diff, "diff", lambda a, b, progress: fake.wait(by_progress(progress)))
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "D")
        app.screen.query_one("Input").value = str(ddp_run / "bare.pth")
        await pilot.press("enter")
        await escape_cancels(app, pilot, fake, DiffScreen)


async def test_escape_cancels_the_per_layer_change(ddp_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.operations import layer_change

    fake = Blocking()
    monkeypatch.setattr(layer_change, "layer_change", lambda a, b, progress, cancelled: fake.wait(cancelled))
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", ddp_run / "epoch2.pth")
        await pilot.press("s")
        await escape_cancels(app, pilot, fake, LayerChangeScreen)


async def test_escape_cancels_the_compare(ddp_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.operations import compare

    fake = Blocking()
    never = threading.Event()

    def load(reference: str, model: Any) -> Any:
        fake.thread = threading.current_thread()
        fake.started.set()
        never.wait(10)  # reading a reference takes no cancel check: its result is dropped instead
        fake.stopped.set()
        raise Cancelled("late")

    monkeypatch.setattr(compare, "load_reference", load)
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await settle(pilot, "c")
        app.screen.query_one("Input").value = str(ddp_run / "bare.pth")
        await pilot.press("enter")
        assert fake.started.wait(10) and fake.thread is not threading.main_thread()
        assert isinstance(app.screen, CompareScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is browser(app)
        never.set()
        await settle(pilot)
        assert app.screen is browser(app) and not app._notifications


async def test_escape_cancels_check_all(ddp_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckpt_tui.core.operations import check

    fake = Blocking()
    monkeypatch.setattr(check, "check_checkpoint", lambda c, progress, cancelled: fake.wait(cancelled))
    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await pilot.press("C")
        await escape_cancels(app, pilot, fake, CheckAllScreen)
        assert "cancelled: nothing was marked" in status(app) and browser(app).check is None


async def test_help_on_a_report_lists_its_keys_from_the_bindings(ddp_run: Path) -> None:
    from ckpt_tui.tui.screens.help import HelpScreen

    app = CkptApp(str(ddp_run / "epoch1.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "D", ddp_run / "bare.pth")
        await settle(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = screen_text(app)
        assert "Compare that way" in shown and "Per-layer change" in shown
        await settle(pilot, "escape")
        assert app.screen is screen


async def test_pgdn_in_the_per_layer_report_moves_a_whole_page(tmp_path: Path) -> None:
    """PgDn moves the view a page (not the 2 lines it took to reach the highlight), PgUp comes back."""
    torch.manual_seed(0)
    a = {f"{i}.weight": torch.randn(8, 8) for i in range(40)}
    torch.save({"model_state_dict": a}, tmp_path / "r1.pth")
    torch.save({"model_state_dict": {k: v + 0.1 * torch.randn(8, 8) for k, v in a.items()}}, tmp_path / "r2.pth")
    app = CkptApp(str(tmp_path / "r1.pth"))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", tmp_path / "r2.pth")
        await settle(pilot, "s")
        assert isinstance(app.screen, LayerChangeScreen)
        listed = app.screen.query_one("#report-list")
        page = listed.scrollable_content_region.height
        assert page > 2 and listed.scroll_y == 0
        await settle(pilot, "pagedown")
        assert listed.scroll_y == page
        assert listed.highlighted is not None and listed.highlighted >= page
        await settle(pilot, "pageup")
        assert listed.scroll_y == 0


# ---- the head: a section's heading and a table's columns stay on screen as its rows scroll ---------------


def head(app: CkptApp) -> str:
    return app.screen.query_one("#report-head").content.plain


def list_lines(app: CkptApp) -> str:
    """The report list's lines now on screen."""
    listed = app.screen.query_one("#report-list")
    return "\n".join(strip.text for strip in listed.render_lines(listed.scrollable_content_region.reset_offset))


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
async def test_the_per_layer_columns_stay_above_the_rows_as_they_scroll(tmp_path: Path, size: tuple[int, int]) -> None:
    torch.manual_seed(0)
    a = {f"blocks.{i}.weight": torch.randn(8, 8) for i in range(60)}
    torch.save({"model_state_dict": a}, tmp_path / "r1.pth")
    torch.save({"model_state_dict": {k: v + 0.1 * torch.randn(8, 8) for k, v in a.items()}}, tmp_path / "r2.pth")
    app = CkptApp(str(tmp_path / "r1.pth"))
    async with app.run_test(size=size) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", tmp_path / "r2.pth")
        await settle(pilot, "s")
        assert isinstance(app.screen, LayerChangeScreen)
        columns = ("layer", "‖a−b‖/‖a‖", "cosine", "‖a‖", "‖b‖")
        # at the top: the heading and the columns once, above the first rows
        assert head(app).startswith("per layer") and all(word in head(app).splitlines()[-1] for word in columns)
        # the rows leave out the start they share (the heading says it: under model_state_dict/blocks.)
        assert screen_text(app).count("‖a−b‖/‖a‖") == 1 and list_lines(app).startswith("0.weight ")
        # a page down: the rows moved, the columns did not
        await settle(pilot, "pagedown")
        assert not list_lines(app).startswith("0.weight ") and "‖a−b‖/‖a‖" not in list_lines(app)
        assert head(app).startswith("per layer") and "‖a−b‖/‖a‖" in head(app)
        # down to the plot: its heading is the head, never shown twice
        listed = app.screen.query_one("#report-list")
        plot = next(i for i, option in enumerate(listed.options) if "relative change by layer" in option.prompt.plain)
        listed.scroll_to(y=listed._index_to_line[plot] + 3, animate=False, immediate=True)
        await settle(pilot)
        assert head(app).startswith("relative change by layer") and "‖a−b‖/‖a‖" not in head(app)
        assert screen_text(app).count("relative change by layer") == 1


async def test_the_compare_report_keeps_the_section_of_its_rows_on_screen_at_80x24(tmp_path: Path) -> None:
    import itertools

    # 64 keys the model has and the checkpoint lacks (names without numbers: listed one a row, not folded)
    names = ["".join(pair) for pair in itertools.product("abcdefgh", repeat=2)]
    torch.save({f"{name}.weight": torch.zeros(2) for name in names}, tmp_path / "reference.pth")
    torch.save({"stray.weight": torch.zeros(2)}, tmp_path / "model.pth")
    app = CkptApp(str(tmp_path / "model.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        await open_report(pilot, "c", tmp_path / "reference.pth")
        first = next(title for title, rows in app.screen.sections if rows)
        assert head(app).startswith(first) and screen_text(app).count(f"{first} (") == 1
        await settle(pilot, "pagedown", "pagedown")
        listed = app.screen.query_one("#report-list")
        assert listed.scroll_y > 0 and "aa.weight" not in list_lines(app)
        assert head(app).startswith("missing (in the reference, not in the checkpoint) (64)")
        # at the end the last section opens in the list; the head is the section of the rows at the top
        await settle(pilot, "end")
        assert "unexpected" in list_lines(app) and "hh.weight" in list_lines(app)
        assert head(app).startswith("missing") and screen_text(app).count("missing (") == 1
        await settle(pilot, "home")
        assert listed.scroll_y == 0 and head(app).startswith(first)


async def test_the_compare_reports_head_is_the_section_in_view_once_the_rows_above_scroll_off(tmp_path: Path) -> None:
    names = ["".join(pair) for pair in itertools.product("abcdefgh", repeat=2)]
    torch.save({f"{name}.weight": torch.zeros(2) for name in names}, tmp_path / "reference.pth")
    torch.save({f"stray{name}.weight": torch.zeros(2) for name in names[:24]}, tmp_path / "model.pth")
    app = CkptApp(str(tmp_path / "model.pth"))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await open_report(pilot, "c", tmp_path / "reference.pth")
        listed = app.screen.query_one("#report-list")
        heading = next(i for i, option in enumerate(listed.options) if "unexpected (" in option.prompt.plain)
        # the rule that ends "missing", then the heading of "unexpected", at the top: no row of "missing" is in
        # view (its title over them read as an empty list)
        for line in (listed._index_to_line[heading] - 1, listed._index_to_line[heading]):
            listed.scroll_to(y=line, animate=False, immediate=True)
            await settle(pilot)
            assert listed.scroll_y == line and "hh.weight" not in list_lines(app)
            assert head(app).startswith("unexpected (in the checkpoint, not in the reference) (24)"), line
        listed.scroll_to(y=listed._index_to_line[heading] - 2, animate=False, immediate=True)
        await settle(pilot)
        assert "hh.weight" in list_lines(app) and head(app).startswith("missing (")


async def test_the_per_layer_rows_and_the_layers_view_shorten_every_key_of_a_listing_alike(tmp_path: Path) -> None:
    torch.manual_seed(0)
    names = ("self_attention.in_proj_weight", "self_attention.in_proj_bias", "linear1.weight", "norm.bias")
    a = {f"transformer_encoder.layers.{i}.{name}": torch.randn(4) for i in range(3) for name in names}
    a["head.weight"] = torch.randn(4)
    torch.save({"model_state_dict": a}, tmp_path / "r1.pth")
    torch.save({"model_state_dict": {k: v + 0.1 for k, v in a.items()}}, tmp_path / "r2.pth")
    app = CkptApp(str(tmp_path / "r1.pth"))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await open_report(pilot, "D", tmp_path / "r2.pth")
        await settle(pilot, "s")
        screen = app.screen
        assert isinstance(screen, LayerChangeScreen)
        for title in ("per layer", "relative change by layer"):
            rows = {key: text.split(" ")[0] for key, text in section(screen, title)}
            layers = [shown for key, shown in rows.items() if ".layers." in key]
            # one rule for the listing: every layer's key that is cut gives up the same start, its number and
            # names kept whole (never transformer_encoder to "t")
            cut = [shown for shown in layers if shown.startswith("…")]
            assert len({shown.split(".")[0].rstrip("0123456789") for shown in cut}) == 1, (title, layers)
            assert all(shown.endswith(key.rsplit(".", 1)[-1]) for key, shown in rows.items() if ".layers." in key)
            assert all(len(part) > 1 or part.isdigit() for shown in layers for part in shown.split(".")[1:])
            assert rows["model_state_dict/head.weight"] == "head.weight"
        await settle(pilot, "escape", "escape", "L")
        await settle(pilot)
        table = app.screen.query_one("LayersTable")
        paths = [str(table.get_row_at(index)[1]) for index in range(table.row_count)]
        layers = [path for path in paths if "self_attention" in path or "linear1" in path or "norm." in path]
        assert len(layers) == 12
        assert all(len(part) > 1 or part.isdigit() for path in layers for part in path.split(".")[1:])


async def test_at_80x24_the_compare_report_keeps_every_mismatch_s_shapes_on_screen(tmp_path: Path) -> None:
    long = "transformer.encoder.layers.{}.self_attention.output_projection.weight"
    torch.save({long.format(i): torch.zeros(64, 64) for i in range(4)}, tmp_path / "model.pth")
    reference = {long.format(i): torch.zeros(32, 32) for i in range(4)}
    reference |= {
        f"transformer.encoder.layers.{i}.feed_forward.extra_gate_projection.weight": torch.zeros(8) for i in range(4)
    }
    torch.save(reference, tmp_path / "reference.pth")
    app = CkptApp(str(tmp_path / "model.pth"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "c", tmp_path / "reference.pth")
        width = screen.query_one("#report-list").scrollable_content_region.width
        rows = [text for title, found in screen.sections if title.startswith("shape mismatches") for _, text in found]
        assert len(rows) == 4 and all(text.plain.endswith(": [64, 64] vs [32, 32]") for text in rows)
        assert all(len(text.plain) <= width for text in rows)
        # the keys' shared start is said once, in the heading; a row still jumps to its whole key
        assert any("under transformer.encoder.layers." in title for title, _ in screen.sections)
        [(_, missing)] = section(screen, "missing")
        assert "{0..3}.feed_forward.extra_gate_projection.weight" in missing and len(missing) <= width
        listed = screen.query_one("#report-list")
        listed.highlighted = next(i for i, t in enumerate(screen.targets) if t == (long.format(2),))
        await settle(pilot, "enter")
        assert cursor_path(app) == (long.format(2),)


def test_a_long_key_path_in_a_finding_wraps_where_its_components_meet() -> None:
    from rich.text import Text

    from ckpt_tui.tui.screens.report import wrapped

    path = 'ckpt["optimizer_states"]["zero_pp_rank_0_mp_rank_00_optim_states.pt"]["optimizer_state_dict"]'
    shown = wrapped(Text(f"· optimizer state at {path}: Adam-style, step 3"), 74).plain
    lines = [line.strip() for line in shown.splitlines()]
    assert all(len(line) <= 74 for line in shown.splitlines())
    # every line ends at a component's end or a word's: no name is split
    assert "".join(lines).replace(" ", "") == f"·optimizerstateat{path}:Adam-style,step3"
    assert '"zero_pp_rank_0_mp_rank_00_optim_states.pt"]' in shown and '["optimizer_state_dict"]' in shown


class _Old(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 10)


class _Combined(torch.nn.Module):
    """_Old with fc1 renamed to proj, fc2 widened 16 -> 24, head replaced by classifier (24 -> 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 24)
        self.classifier = torch.nn.Linear(24, 5)


async def test_after_x_the_compare_fix_says_strict_false_still_raises_on_the_mismatches_it_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ckpt_tui.cli import main

    torch.save({"epoch": 3, "model_state_dict": _Old().state_dict()}, tmp_path / "old.pth")
    torch.save(_Combined().state_dict(), tmp_path / "ref.pth")
    app = CkptApp(str(tmp_path / "old.pth"))
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await loaded(pilot)
        browser(app).tree_view.reveal((("model_state_dict",), None))
        await settle(pilot, "x", "y")
        screen = await open_report(pilot, "c", tmp_path / "ref.pth")
        said = " ".join(text for _, text in section(screen, "suggested fix"))
        # (the mismatches are listed above as well: the fix still names them, and what strict=False does)
        assert "shape mismatches left after it: fc2.weight: [16, 16] vs [24, 16]" in said
        assert "load_state_dict(strict=False) still raises on them" in said
        assert "--drop fc2.weight --drop fc2.bias" in said
        assert "it still raises on the shape mismatches left" in said
        shown = " ".join(body(app).split())
        assert "(this assumes the 1 staged edit is saved first, to" in shown
    # the CLI says the same of the file the edit saves
    model = tmp_path / "model.pth"
    torch.save(_Old().state_dict(), model)
    capsys.readouterr()
    assert main(["check", str(model), "--against", str(tmp_path / "ref.pth")]) == 1
    out = capsys.readouterr().out
    assert "load_state_dict(strict=False) still raises on them: to load anyway, drop them too (--drop fc2.weight" in out
    # (the note above says no fix drops them: a drop is the user's choice, to load anyway)
    assert "2 of 4 keys differ in shape, half of the model, not a head" in out


async def test_a_staged_fix_that_loads_only_with_strict_false_keeps_saying_so(tmp_path: Path) -> None:
    def weights(head: str, classes: int) -> dict[str, torch.Tensor]:
        return {
            "conv.weight": torch.zeros(4, 3, 3, 3),
            "conv.bias": torch.zeros(4),
            f"{head}.weight": torch.zeros(classes, 4),
        }

    trained = {f"module.{key}": value for key, value in weights("fc", 10).items()}
    torch.save({"epoch": 3, "state_dict": trained}, tmp_path / "run.pth")
    torch.save(weights("head", 5), tmp_path / "reference.pth")
    app = CkptApp(str(tmp_path / "run.pth"))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "c", tmp_path / "reference.pth")
        assert screen.report.suggestion is not None and not screen.report.suggestion.full
        await settle(pilot, "f", "y")
        await settle(pilot, "j", "k")  # the note of the edit is gone; what the tree needs stays
        said = " ".join(status(app).split())
        assert "loads with strict=False only: head.weight keeps the model's initial values" in said
        # an edit on top of it still needs strict=False; undoing the fix does not
        await settle(pilot, "j", "d", "y")
        assert "2 unsaved edits" in status(app) and "strict=False" in " ".join(status(app).split())
        await settle(pilot, "u", "u")
        assert "strict=False" not in " ".join(status(app).split())


async def test_enter_on_a_missing_key_says_there_is_nothing_to_go_to(tmp_path: Path) -> None:
    torch.save({"fc.weight": torch.zeros(2), "bn.weight": torch.zeros(2)}, tmp_path / "reference.pth")
    torch.save({"fc.weight": torch.zeros(2), "stray": torch.zeros(2)}, tmp_path / "model.pth")
    app = CkptApp(str(tmp_path / "model.pth"))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await loaded(pilot)
        screen = await open_report(pilot, "c", tmp_path / "reference.pth")
        listed = screen.query_one("#report-list")
        row = next(i for i, option in enumerate(listed.options) if option.prompt.plain.strip() == "bn.weight")
        listed.highlighted = row
        await settle(pilot, "enter")
        assert app.screen is screen  # still the report
        said = [n.message for n in app._notifications]
        assert any("bn.weight is in the reference only" in message for message in said), said


async def test_at_80x24_the_compare_report_shows_the_fix_its_key_and_command_with_the_notes_under_them() -> None:
    """A LoRA run saved by Lightning's Trainer against the plain model (tests/fixtures/peft): the PEFT and Lightning
    notes alone took the summary's box, hiding 'f applies it here' and the command, and pushed the key hint out
    of the dialog (user12 S1-5). The fix and how to apply it come under the verdict, the notes lead the list."""
    fixtures = Path(__file__).parent / "fixtures" / "peft"
    app = CkptApp(str(fixtures / "lora_run.ckpt"))
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await open_report(pilot, "c", fixtures / "plain.pth")
        shown = screen_text(app)
        assert "f applies it here as one undoable edit" in shown and "ckpt-tui convert" in shown, shown
        assert "notes (3)" in shown and "PEFT/LoRA layout" in shown, shown
        assert "f: apply the suggested fix" in shown, shown  # the hint line is inside the box
        assert shown.index("suggested fix:") < shown.index("notes (3)") < shown.index("f: apply the suggested fix")
