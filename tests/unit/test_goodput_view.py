"""``status``'s goodput: the nodes' published accounts merged as node-seconds; the gauges."""

from __future__ import annotations

import pytest

from elastic_run.agent.loop import goodput as gp
from elastic_run.cli.status_pictures import goodput_picture
from elastic_run.cli.views.goodput_view import render_goodput


def _account(restart_at: float | None, now: float) -> gp.GoodputAccount:
    fold = gp.on_event(gp.begin(0.0), "workers.started", 1.0)
    fold = gp.beat(fold, 1, 2.0)
    fold = gp.beat(fold, 2, 3.0)
    if restart_at is not None:
        fold = gp.on_event(fold, "worker.failed", restart_at)
        fold = gp.on_event(fold, "restart", restart_at)
    return gp.account(fold, now)


def test_one_node_is_the_job_and_two_are_summed() -> None:
    a = {"account": _account(4.0, 6.0).to_json(with_restarts=False), "ts": 100.0}
    alone = goodput_picture({"n1": a}, now_s=101.0)
    assert alone is not None
    assert alone["job"] == a["account"]
    assert alone["nodes"]["n1"]["age_s"] == pytest.approx(1.0)
    b = {"account": _account(None, 10.0).to_json(with_restarts=False), "ts": 100.0}
    both = goodput_picture({"n1": a, "n2": b, "n3": {"account": {"v": 7}}}, now_s=101.0)
    assert both is not None
    job = both["job"]
    assert job["nodes"] == 2 and job["wall_s"] == pytest.approx(16.0)
    assert job["restart_count"] == 1
    assert job["training_s"] + job["lost_s"] == pytest.approx(job["wall_s"], abs=0.01)
    assert len(both["problems"]) == 1 and "gp/n3" in both["problems"][0]
    assert render_goodput(both) is not None
    assert goodput_picture({}) is None


def test_the_gauges_say_the_account() -> None:
    acc = _account(4.0, 6.0)
    gauges = gp.goodput_metrics(acc)
    assert gauges["goodput_ratio"] == pytest.approx(acc.share)
    assert gauges["goodput_restarts"] == 1.0
    lost = [v for k, v in gauges.items() if k.startswith("goodput_lost_seconds{")]
    assert sum(lost) == pytest.approx(gauges["goodput_lost_seconds_total"])
    assert gp.goodput_metrics(None) == {}
