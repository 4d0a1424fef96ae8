"""``elastic-run report`` on a real job, its page checked in a real headless Chromium.

One job (module fixture; c10d, three loopback nodes a, b, c of one gloo worker each,
``report_scripts/train.py``): b's worker raises in the first full round, a's worker hangs in the
next (``--hang-timeout 5``: its agent takes its stacks and kills it), b is a straggler (node 0
judges it), then c's agent is SIGKILLed and a and b go on in a round of two and finish. Then
``elastic-run report`` over the nodes' log directories writes the page, prints the summary and
(``--json``) the report. The page is opened from its file in Chromium: ``--dump-dom`` gives its
lanes, markers and links (each link must open a file beside the page), and ``--screenshot`` its
pixels, decoded here (zlib by hand), where each node's lane must be drawn in the phases' colours,
and where the CSS zoom must widen the time axis.

No test sleeps or asserts on a duration: each waits (with a deadline) for the events it needs.
"""

from __future__ import annotations

import html.parser
import json
import os
import signal
import struct
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from elastic_run.cli.report.html_page import CAUSE_COLORS
from tests.e2e.test_multinode import FAST_CONF, Job
from tests.helpers import free_port, run_cli, wait_until
from tests.machine import require_program

TRAIN = Path(__file__).resolve().parent / "report_scripts" / "train.py"
ENV = {"FAIL_NODE": "b", "HANG_NODE": "a", "STRAGGLER_NODE": "b", "STRAGGLER_S": "0.15"}
EXTRA = ("--hang-timeout", "5", "--max-restarts", "5", "--tee", "3")
WINDOW = (1300, 1400)
# A screenshot row belongs to a bar when this many of its pixels are in the phases' colours
# (a lane is about 1,060 pixels wide here; the legend's squares add up to about 120).
BAR_PIXELS = 200

pytestmark = pytest.mark.timeout(600)


@dataclass
class Done:
    """The finished job, its report and the browser's view of it."""

    job: Job
    page: Path
    summary: str
    stderr: str
    body: dict[str, Any]
    label: dict[str, str]  # node name (a, b, c) -> its lane's label
    chromium: str


def _events(job: Job, name: str) -> list[dict[str, Any]]:
    try:
        return job.nodes[name].events()
    except ValueError:  # no run folder yet
        return []


def _running(job: Job, name: str, world: int, restart_count: int | None = None) -> bool:
    """Whether the node's last round has ``world`` nodes (and that restart count) and its
    workers run."""
    events = _events(job, name)
    phases = [
        e
        for e in events
        if e["kind"] in ("rendezvous.complete", "workers.started", "workers.stopped")
    ]
    if len(phases) < 2 or phases[-1]["kind"] != "workers.started":
        return False
    done = phases[-2]["fields"]
    return done.get("group_world_size") == world and (
        restart_count is None or done.get("restart_count") == restart_count
    )


def _run_job(job: Job) -> None:
    for name in "abc":
        job.start(
            name,
            nnodes="2:3",
            conf=FAST_CONF,
            host=name == "a",
            extra=EXTRA,
            env=ENV,
            script=(str(TRAIN),),
        )

    # b fails (restart 1), then a hangs (restart 2): all three run again, with a straggler.
    def full_round_with_straggler() -> bool:
        if not all(_running(job, n, 3, restart_count=2) for n in "abc"):
            return False
        since = max(e["ts"] for e in _events(job, "a") if e["kind"] == "rendezvous.complete")
        judged = [e for n in "abc" for e in _events(job, n) if e["kind"] == "straggler"]
        return any(e["ts"] > since for e in judged)  # by the round's node 0, whichever it is

    wait_until(full_round_with_straggler, 240, interval_s=0.5, message=job.report)
    c = job.nodes["c"]
    c.remember_descendants()
    os.kill(c.proc.pid, signal.SIGKILL)
    assert c.proc.wait(timeout=60) == -signal.SIGKILL
    wait_until(
        lambda: all(_running(job, n, 2) for n in "ab"), 120, interval_s=0.5, message=job.report
    )
    job.go()
    assert job.wait_exit("a", 120) == 0, job.report()
    assert job.wait_exit("b", 60) == 0, job.report()
    job.assert_no_survivors()


@pytest.fixture(name="done", scope="module")
def done_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Done]:
    chromium = require_program("chromium", "chromium")
    tmp = tmp_path_factory.mktemp("report")
    job = Job(tmp, "c10d", f"127.0.0.1:{free_port()}")
    try:
        _run_job(job)
    finally:
        job.kill_all()
    page = tmp / "pages" / "report.html"
    page.parent.mkdir()
    logs = [str(tmp / "logs" / n) for n in "abc"]  # each node's --log-dir
    made = run_cli(["report", *logs, "-o", str(page)], env={"COLUMNS": "200"}, timeout_s=120)
    assert made.returncode == 0, made.stderr
    as_json = run_cli(["report", str(tmp / "logs"), "--json"], timeout_s=120)
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    label = {n["folder"].split("/")[0]: n["node"] for n in body["nodes"]}
    yield Done(job, page, made.stdout, made.stderr, body, label, chromium)


# -- the report, read as JSON and as the summary -----------------------------------------------


def test_the_report_tells_the_jobs_story(done: Done) -> None:
    body = done.body
    assert done.stderr == ""  # no problem with the input
    assert body["run_id"] == done.job.run_id and sorted(done.label) == ["a", "b", "c"]
    assert body["outcome"] == "succeeded on 2 nodes; 1 node lost"
    assert body["restart_count"] == 2  # b's failure and a's hang; c's loss is not counted
    root = body["root_cause"]
    assert root["node"] == done.label["b"] and "injected failure on node b" in root["cause"]
    by_style: dict[str, list[dict[str, Any]]] = {}
    for v in body["verdicts"]:
        by_style.setdefault(v["style"], []).append(v)
    assert {v["node"] for v in by_style["hang"]} == {done.label["a"]}
    assert "train.py" in by_style["hang"][0]["cause"]
    assert Path(by_style["hang"][0]["links"]["stacks"]).is_file()
    assert {v["node"] for v in by_style["straggler"]} == {done.label["b"]}
    assert {v["node"] for v in by_style["lost"]} == {done.label["c"]}
    failed = {v["node"] for v in by_style["failure"]}
    assert done.label["b"] in failed and done.label["a"] in failed  # b's raise, a's killed rank
    ended = {n["folder"].split("/")[0]: n["ended"] for n in body["nodes"]}
    assert ended == {"a": "succeeded", "b": "succeeded", "c": "lost"}
    # Rounds: the last has a and b only; every earlier full round had all three.
    assert len(body["rounds"]) >= 4
    last = body["rounds"][-1]
    assert sorted(last["nodes"]) == sorted([done.label["a"], done.label["b"]])
    assert "member lost" in [r["ended"] for r in body["rounds"]]
    # One host, one clock: the offsets the rounds give are within the rendezvous's latency.
    for node in body["nodes"]:
        assert node["clock"]["aligned"] and abs(node["clock"]["offset_s"]) < 2.0
        assert node["clock"]["residual_s"] < 2.0
    assert body["goodput"]["nodes"] == 2  # c was killed: it left no account
    for line in (
        done.job.run_id,
        "succeeded on 2 nodes",
        "root cause",
        "goodput",
        "rounds",
        "verdicts",
        "straggler",
        f"page: {done.page}",
    ):
        assert line in done.summary, (line, done.summary)


def test_each_lane_adds_up_to_the_account_its_node_recorded(done: Done) -> None:
    for node in done.body["nodes"]:
        account = node["goodput"]
        if account is None:
            assert node["folder"].startswith("c/")
            assert {p[0] for p in node["phases"]} >= {"startup", "running"}
            continue
        got: dict[str, float] = {}
        for cause, start, end in node["phases"]:
            got[cause] = got.get(cause, 0.0) + end - start
        assert sum(got.values()) == pytest.approx(account["wall_s"], abs=0.05)
        assert got.get("startup", 0.0) == pytest.approx(account["lost"]["startup"], abs=0.05)
        assert got.get("end", 0.0) == pytest.approx(account["lost"]["end"], abs=0.05)
        # Detection is dated from the failure on the replay, from the last beat read in the
        # agent (its beats are not in the log): within a second or so of each other.
        for cause, seconds in account["lost"].items():
            if cause.startswith("restart."):
                assert got.get(cause, 0.0) == pytest.approx(seconds, abs=1.5), (cause, got)
        working = got.get("training", 0.0) + got.get("stall", 0.0)
        assert working == pytest.approx(account["training_s"] + account["lost"]["stall"], abs=1.5)


# -- the page in a real browser ----------------------------------------------------------------


class _Elements(html.parser.HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def _chromium(done: Done, *args: str, page: Path | None = None) -> subprocess.CompletedProcess[str]:
    profile = done.page.parent.parent / "chromium-profile"
    command = [
        done.chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--no-first-run", f"--user-data-dir={profile}", *args,
        (page or done.page).resolve().as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_page_shows_lanes_markers_and_links_that_open(done: Done) -> None:
    dom = _chromium(done, "--dump-dom").stdout
    parser = _Elements()
    parser.feed(dom)
    elements = parser.found
    assert not [tag for tag, _ in elements if tag in ("script", "iframe", "link", "img")]
    rows = [a for tag, a in elements if tag == "g" and a.get("class", "").startswith("row")]
    assert sorted(r["data-label"] for r in rows) == sorted(done.label.values())
    marks = [a for tag, a in elements if "mk" in a.get("class", "").split() and "data-node" in a]

    def marked(style: str, name: str) -> list[dict[str, str]]:
        return [
            m for m in marks if style in m["class"].split() and m["data-node"] == done.label[name]
        ]

    assert marked("failure", "b") and marked("hang", "a") and marked("straggler", "b")
    assert marked("lost", "c") and marked("close", "a") and marked("close", "b")
    assert any(m["href"].endswith("/stderr.log") for m in marked("failure", "b"))
    assert all(m["href"].endswith("/stacks.txt") for m in marked("hang", "a"))
    b_rank = marked("failure", "b")[0]["data-rank"]
    assert b_rank == str(done.body["root_cause"]["rank"])
    # Every link opens a file beside the page: relative, no network, no absolute path.
    hrefs = [a["href"] for tag, a in elements if tag == "a" and "href" in a]
    assert len(hrefs) >= 10
    for href in hrefs:
        assert not href.startswith(("/", "http:", "https:", "file:")), href
        target = (done.page.parent / href).resolve()
        assert target.is_file(), href
    opened = {Path(h).name for h in hrefs}
    assert {"stderr.log", "stacks.txt", "error.json", "events.jsonl"} <= opened
    text = dom.replace("&nbsp;", " ")
    assert "injected failure on node b" in text and "Root cause" in text
    assert 'id="verdicts"' in text and 'id="rounds"' in text and 'id="clocks"' in text


def _decode_png(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG's pixels as an array (height, width, channels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, [], b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = chunk
        elif kind == b"IDAT":
            idat.append(chunk)
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", head)
    assert depth == 8 and interlace == 0 and color in (2, 6), (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:  # sub: a running sum per channel
            cur = line.reshape(width, bpp).cumsum(axis=0).reshape(stride) % 256
        elif kind == 2:  # up
            cur = (line + prev) % 256
        else:  # average, paeth: byte by byte
            row, up = line.tolist(), prev.tolist()
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                if kind == 3:
                    row[i] = (row[i] + (left + up[i]) // 2) % 256
                else:
                    corner = up[i - bpp] if i >= bpp else 0
                    p = left + up[i] - corner
                    pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - corner)
                    guess = left if pa <= pb and pa <= pc else (up[i] if pb <= pc else corner)
                    row[i] = (row[i] + guess) % 256
            cur = np.array(row, np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


def _cause_pixels(image: np.ndarray, causes: tuple[str, ...]) -> np.ndarray:
    """Per pixel: whether it is exactly one of ``causes``' colours."""
    keys = (image[:, :, 0].astype(np.int64) << 16) | (image[:, :, 1].astype(np.int64) << 8)
    keys |= image[:, :, 2]
    wanted = [int(CAUSE_COLORS[c].lstrip("#"), 16) for c in causes]
    return np.isin(keys, wanted)


def _bars(mask: np.ndarray) -> list[tuple[int, int]]:
    """The runs of screenshot rows (first, last) that are bars in the phases' colours."""
    rows = mask.sum(axis=1) >= BAR_PIXELS
    runs, start = [], None
    for y, on in enumerate(rows.tolist()):
        if on and start is None:
            start = y
        elif not on and start is not None:
            runs.append((start, y - 1))
            start = None
    if start is not None:
        runs.append((start, len(rows) - 1))
    return runs


def _screenshot(done: Done, name: str, page: Path | None = None) -> np.ndarray:
    shot = done.page.parent / name
    _chromium(done, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page=page)
    return _decode_png(shot.read_bytes())


def test_the_screenshot_draws_every_lane_and_the_css_zoom_widens_time(done: Done) -> None:
    image = _screenshot(done, "shot-1x.png")
    assert image.shape[:2] == (WINDOW[1], WINDOW[0])
    every = tuple(CAUSE_COLORS)
    bars = _bars(_cause_pixels(image, every))
    # The goodput bar, then one bar per lane (14 px each), nothing blank.
    assert len(bars) == 4, bars
    lanes = bars[1:]
    assert all(10 <= last - first + 1 <= 16 for first, last in lanes), lanes
    band = image[lanes[0][0] : lanes[-1][1] + 1]
    drawn = {c for c in every if _cause_pixels(band, (c,)).sum() > 20}
    # Time is drawn to scale: a phase shows in its own colour where it is a few pixels wide. A
    # warm restart's rendezvous (a tenth of a second in a minute's job) may be under one pixel.
    columns = np.flatnonzero(_cause_pixels(band, every).any(axis=0))
    px_per_s = (columns[-1] - columns[0] + 1) / (done.body["end_s"] - done.body["start_s"])
    widest: dict[str, float] = {}
    for node in done.body["nodes"]:
        for cause, start, end in node["phases"]:
            widest[cause] = max(widest.get(cause, 0.0), (end - start) * px_per_s)
    wide = {c for c, px in widest.items() if px >= 6}
    assert {"training", "startup", "restart.first_beat", "stall"} <= wide, widest
    assert wide <= drawn, (widest, drawn)
    assert "restart.rendezvous" in widest  # in the account, however short
    assert "running" in drawn  # c's lane: it left no account
    training_1x = int(_cause_pixels(band, ("training",)).sum())
    # Zoomed 64x (the radio button's state as saved in a copy), the job's first 64th fills the
    # view: node 0's start-up (its interpreter, torch's import), before any training.
    text = done.page.read_text()
    assert ' id="z1" checked' in text
    zoomed = done.page.with_name("zoomed.html")
    zoomed.write_text(
        text.replace(' id="z1" checked', ' id="z1"').replace(' id="z64"', ' id="z64" checked')
    )
    image_64x = _screenshot(done, "shot-64x.png", page=zoomed)
    band_64x = image_64x[lanes[0][0] : lanes[-1][1] + 1]
    assert _cause_pixels(band_64x, ("startup",)).sum() > _cause_pixels(band, ("startup",)).sum()
    assert _cause_pixels(band_64x, ("training",)).sum() < training_1x / 4
