"""Reading py-spy's stacks (``agent/progress/stack_report.py``): where a worker is, what is user code,
and the text of ``stacks.txt``."""

from __future__ import annotations

import json

import pytest

from elastic_run.agent.progress.stack_report import (
    StackReport,
    format_stacks,
    is_library_file,
    parse_py_spy_json,
)

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def _frame(name: str, filename: str, line: int) -> dict[str, object]:
    return {"name": name, "filename": filename, "line": line, "short_filename": "x"}


def _dump(pid: int, main: list[dict[str, object]], other: list[dict[str, object]]) -> str:
    return json.dumps(
        [
            {
                "pid": pid,
                "thread_name": "reader",
                "os_thread_id": pid + 1,
                "active": False,
                "frames": other,
            },
            {
                "pid": pid,
                "thread_name": "MainThread",
                "os_thread_id": pid,
                "active": True,
                "frames": main,
            },
        ]
    )


IN_ALL_REDUCE = [
    _frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2801),
    _frame("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
    _frame("train_step", "/home/me/proj/train.py", 88),
    _frame("<module>", "/home/me/proj/train.py", 120),
]
IN_A_LOCK = [
    _frame("Condition.wait", f"{STDLIB}/threading.py", 327),
    _frame("Event.wait", f"{STDLIB}/threading.py", 629),
    _frame("load_batch", "/home/me/proj/data.py", 41),
    _frame("main", "/home/me/proj/train.py", 70),
]


def test_a_rank_in_all_reduce_is_named_with_the_users_line() -> None:
    report = parse_py_spy_json(100, _dump(100, IN_ALL_REDUCE, IN_A_LOCK))
    where = report.where()
    assert where is not None
    assert where.text() == "all_reduce at train.py:88"
    assert where.in_collective


def test_a_rank_stuck_elsewhere_is_not_in_a_collective() -> None:
    report = parse_py_spy_json(7, _dump(7, IN_A_LOCK, IN_ALL_REDUCE))
    where = report.where()
    assert where is not None
    assert (where.function, where.text(), where.in_collective) == (
        "Condition.wait",
        "Condition.wait at data.py:41",
        False,
    )


def test_the_main_thread_is_listed_first() -> None:
    report = parse_py_spy_json(7, _dump(7, IN_A_LOCK, IN_ALL_REDUCE))
    assert report.threads[0].name == "MainThread" and report.main_thread is report.threads[0]


def test_a_backward_pass_counts_as_waiting_for_peers() -> None:
    frames = [
        _frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 829),
        _frame("backward", f"{SITE}/torch/_tensor.py", 625),
        _frame("main", "/p/train.py", 9),
    ]
    where = parse_py_spy_json(1, _dump(1, frames, [])).where()
    assert where is not None and where.in_collective


def test_a_stack_of_library_code_only_names_the_function() -> None:
    frames = [_frame("sleep", f"{STDLIB}/time.py", 1)]
    where = parse_py_spy_json(1, _dump(1, frames, [])).where()
    assert where is not None and where.user_frame is None and where.text() == "sleep"


def test_our_own_package_is_not_user_code() -> None:
    assert is_library_file("/src/elastic_run/worker.py", ["/src/elastic_run"])
    assert not is_library_file("/src/elastic_run_train.py", ["/src/elastic_run"])
    assert is_library_file("<frozen importlib._bootstrap>")
    assert not is_library_file("/home/me/train.py")


@pytest.mark.parametrize("text", ["", "{}", "[1]", '[{"frames": 3}]', "not json"])
def test_output_that_is_not_py_spys_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="py-spy"):
        parse_py_spy_json(1, text)


def test_stacks_txt_lists_every_thread_innermost_first() -> None:
    report = parse_py_spy_json(100, _dump(100, IN_ALL_REDUCE, IN_A_LOCK))
    text = format_stacks(report, "# stacks of rank 3")
    lines = text.splitlines()
    assert lines[0] == "# stacks of rank 3"
    assert 'Thread 100 (active) "MainThread"' in lines
    assert lines.index(
        f"    all_reduce ({SITE}/torch/distributed/distributed_c10d.py:2801)"
    ) < lines.index("    train_step (/home/me/proj/train.py:88)")
    assert 'Thread 101 (idle) "reader"' in lines


def test_stacks_txt_says_why_there_are_none() -> None:
    text = format_stacks(StackReport(5, error="no permission"), "# rank 0")
    assert text == "# rank 0\nno stacks: no permission\n"
    assert StackReport(5, error="x").where() is None
