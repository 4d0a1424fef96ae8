"""The link check's pure parts (``agent/link_check``): who pairs with whom, the slow-node rule and
what each mode does with it, the flag's parser, and the helper's record as the agent decodes it.
No process, socket or store: the helpers' own test is tests/integration/test_link_check.py."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from elastic_run.agent.link_check import (
    FLAG_ROW,
    LinkCheckMode,
    LinkReport,
    link_verdict,
    parse_link_check_mode,
    run_link_check,
    slow_event_fields,
    slow_message,
    slow_nodes,
)
from elastic_run.agent.link_check.helper_process import HelperArgs
from elastic_run.agent.link_check.report import (
    Measurement,
    decode_measurement,
    encode_measurement,
    figures_from_table,
)
from elastic_run.agent.link_check.schedule import pairings, partner_in

MB = 1e6


def _report(*bw_mb: float, factor: float = 1.5) -> LinkReport:
    bw = tuple(b * MB for b in bw_mb)
    return LinkReport(len(bw), "gloo", 4 << 20, bw, (), 1.0, 0.2, 1.0, factor, ())


# -- who pairs with whom ----------------------------------------------------------------------


@pytest.mark.parametrize("n", range(0, 41))
def test_each_round_pairs_each_node_once_and_no_pair_twice(n: int) -> None:
    rounds = pairings(n)
    assert len(rounds) == (0 if n < 2 else min(3, n - 1 if n % 2 == 0 else n))
    seen: set[tuple[int, int]] = set()
    for pairs in rounds:
        members = [r for pair in pairs for r in pair]
        assert len(members) == len(set(members)) and all(0 <= r < n for r in members)
        assert n - len(members) == n % 2  # an odd count leaves exactly one node out
        assert not seen & set(pairs)
        seen |= set(pairs)
    for rank in range(n):
        partners = {partner_in(pairs, rank) for pairs in rounds} - {None}
        # From three nodes on, everyone meets two partners: a slow one is outvoted.
        assert len(partners) >= (0 if n < 2 else 1 if n == 2 else 2), (n, rank, partners)


def test_a_full_tournament_meets_everyone() -> None:
    for n in (4, 5, 8):
        rounds = pairings(n, rounds=n)
        assert {p for pairs in rounds for p in pairs} == set(itertools.combinations(range(n), 2))


def test_pairings_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        pairings(-1)
    with pytest.raises(ValueError):
        pairings(4, rounds=0)


# -- the rule ---------------------------------------------------------------------------------


def test_a_node_under_median_over_factor_is_slow_and_only_it() -> None:
    assert slow_nodes(_report(900, 880, 12, 910), 1.5) == (2,)
    assert slow_nodes(_report(900, 880, 12, 910, 11), 1.5) == (2, 4)


def test_a_fair_spread_names_nobody() -> None:
    assert slow_nodes(_report(900, 700, 610, 1000), 1.5) == ()  # 610 >= 800 / 1.5
    assert slow_nodes(_report(5, 5, 5), 1.5) == ()


def test_the_boundary_is_strictly_under() -> None:
    # median 300, floor 300 / 1.5 = 200: 200 is not slow, 199.9 is.
    assert slow_nodes(_report(200, 300, 400), 1.5) == ()
    assert slow_nodes(_report(199.9, 300, 400), 1.5) == (0,)


def test_fewer_than_two_nodes_name_nobody() -> None:
    assert slow_nodes(_report(), 1.5) == ()
    assert slow_nodes(_report(0.001), 1.5) == ()
    assert slow_nodes(_report(0, 0, 0), 1.5) == ()  # a median of 0: no floor


def test_two_nodes_are_compared_too() -> None:
    assert slow_nodes(_report(10, 100), 1.5) == (0,)  # median 55, floor 36.7
    assert slow_nodes(_report(90, 100), 1.5) == ()


@pytest.mark.parametrize("factor", [1.0, 0.5, 0.0, -1.0, math.inf, math.nan])
def test_a_factor_not_above_one_is_refused(factor: float) -> None:
    with pytest.raises(ValueError, match="above 1"):
        slow_nodes(_report(1, 2, 3), factor)


def test_warn_names_and_never_excludes() -> None:
    report = _report(900, 12, 910)
    verdict = link_verdict(report, LinkCheckMode.WARN, 1.5, spares_waiting=3)
    assert verdict.named == (1,) and verdict.excluded == ()


def test_off_says_nothing() -> None:
    verdict = link_verdict(_report(900, 12, 910), LinkCheckMode.OFF, 1.5, spares_waiting=1)
    assert verdict.named == () and verdict.excluded == ()


def test_exclude_needs_a_waiting_spare_and_takes_the_slowest_first() -> None:
    report = _report(900, 20, 910, 10, 905)
    assert link_verdict(report, LinkCheckMode.EXCLUDE, 1.5, 0).excluded == ()
    one = link_verdict(report, LinkCheckMode.EXCLUDE, 1.5, 1)
    assert one.named == (1, 3) and one.excluded == (3,)
    assert link_verdict(report, LinkCheckMode.EXCLUDE, 1.5, 5).excluded == (1, 3)
    assert link_verdict(_report(900, 910), LinkCheckMode.EXCLUDE, 1.5, 2).excluded == ()


def test_the_warning_line_and_the_event_say_the_facts() -> None:
    report = _report(900, 12, 910)
    line = slow_message(report, 1, "10.0.0.2")
    assert line == (
        "link check: node 1 (10.0.0.2) moved 12.0 MB/s, under 1/1.5 of the median 900.0 MB/s "
        "of 3 nodes (gloo, 4 MiB exchanges)"
    )
    assert "\n" not in line
    fields = slow_event_fields(report, 1, LinkCheckMode.WARN, excluded=False, host="10.0.0.2")
    assert fields == {
        "node": 1,
        "host": "10.0.0.2",
        "bandwidth_bytes_per_s": 12 * MB,
        "median_bytes_per_s": 900 * MB,
        "ratio": 75.0,
        "factor": 1.5,
        "mode": "warn",
        "excluded": False,
        "backend": "gloo",
        "size_bytes": 4 << 20,
        "world_size": 3,
    }
    json.dumps(fields, allow_nan=False)  # an event's fields are plain JSON
    zero = slow_event_fields(_report(900, 0, 910), 1, LinkCheckMode.EXCLUDE, excluded=True)
    assert zero["ratio"] is None and zero["host"] is None


# -- the flag ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["off", "warn", "exclude"])
def test_the_three_values_parse(text: str) -> None:
    assert parse_link_check_mode(text).value == text


@pytest.mark.parametrize(
    "text", ["", "0", "-1", "abc", "inf", "nan", "on", "true", "WARN", " warn", "warn,exclude"]
)
def test_any_other_value_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_link_check_mode(text)
    message = str(info.value)
    assert message.startswith("--link-check must be off, warn or exclude, got ")
    assert "\n" not in message


def test_a_huge_value_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as info:
        parse_link_check_mode("x" * 10_000)
    assert len(str(info.value)) < 120


def test_the_flag_row_for_the_settings_table() -> None:
    assert (FLAG_ROW.name, FLAG_ROW.flag, FLAG_ROW.default) == (
        "link_check",
        "--link-check",
        "warn",
    )
    assert FLAG_ROW.choices == ("off", "warn", "exclude")
    assert "--straggler-factor" in FLAG_ROW.help and "\n" not in FLAG_ROW.help


# -- the helper's record ----------------------------------------------------------------------


def test_a_record_round_trips() -> None:
    m = Measurement((1e9, 1e9), ((0, 1, 1e9),), 5e8, 0.4)
    assert decode_measurement(encode_measurement(m), 2) == m
    again = Measurement((1e9, 1e9, 1e7), ((0, 1, 1e9), (1, 2, 1e7)), 5e6, 0.9, rechecked=(2,))
    assert decode_measurement(encode_measurement(again), 3) == again


def test_the_table_gives_each_pair_its_faster_side_and_each_node_its_best_pair() -> None:
    # rows[a][b]: what a timed with b; a trailing column (the all-reduce) is ignored.
    rows = [[0, 900, 10, 7], [600, 0, 0, 7], [12, 0, 0, 7]]
    pairs, nodes = figures_from_table(rows, 3)
    assert pairs == {(0, 1): 900.0, (0, 2): 12.0}
    assert nodes == (900.0, 900.0, 12.0)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not json",
        "[]",
        '{"v": 2, "bandwidth": [1, 2], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, NaN], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, Infinity], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, -2], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, true], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, "2"], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [[0, 7, 1]], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [[0, 1]], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [[1, 0, 1]], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [[1, 1, 1]], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": {}, "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [], "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [], "all_reduce": 1e999, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [], "all_reduce": 1, "measure_s": 1}',
        '{"v": 1, "bandwidth": [1, 2], "pairs": [], "all_reduce": 1, "measure_s": 1, '
        '"rechecked": [5]}',
        '{"v": 1, "bandwidth": [' + "1," * 3_000_000 + "1]}",
    ],
)
def test_a_garbage_record_is_one_value_error(line: str) -> None:
    with pytest.raises(ValueError) as info:
        decode_measurement(line, 2)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


# -- the runner's arguments (nothing starts) ----------------------------------------------------


def test_one_node_measures_nothing_and_starts_nothing() -> None:
    report = run_link_check(0, 1, "127.0.0.1", 1, "p", "gloo", factor=1.5)
    assert not report.measured and report.slow == () and report.duration_s == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rank": 2, "world_size": 2},
        {"rank": -1},
        {"store_port": 0},
        {"store_port": 70000},
        {"backend": "mpi"},
        {"size_bytes": 0},
        {"size_bytes": 2 << 30},
        {"timeout_s": 0.0},
        {"timeout_s": -1.0},
        {"timeout_s": math.inf},
        {"timeout_s": math.nan},
        {"factor": 1.0},
        {"factor": math.nan},
        {"repeats": 0},
        {"rounds": 0},
    ],
)
def test_arguments_out_of_range_are_refused_before_anything_starts(
    kwargs: dict[str, object],
) -> None:
    args: dict[str, object] = {
        "rank": 0, "world_size": 2, "store_addr": "127.0.0.1", "store_port": 1, "prefix": "p",
        "backend": "gloo", "size_bytes": 1 << 20, "timeout_s": 5.0, "factor": 1.5,
    }  # fmt: skip
    args.update(kwargs)
    with pytest.raises(ValueError):
        run_link_check(**args)  # type: ignore[arg-type]


# -- the helper's arguments ---------------------------------------------------------------------


def test_the_helpers_arguments_round_trip() -> None:
    args = HelperArgs(1, 3, "10.0.0.1", 29500, "link-check/4/0", "gloo", 1 << 20, 30.0, 1.5, 3, 3)
    assert HelperArgs.from_json(args.to_json() + "\n") == args


@pytest.mark.parametrize(
    "change",
    [
        {"rank": 3},
        {"rank": True},
        {"store_port": 0},
        {"backend": "mpi"},
        {"timeout_s": "30"},
        {"size_bytes": 1.5},
        {"timeout_s": math.nan},
        {"timeout_s": -1.0},
        {"factor": 1.0},
        {"factor": math.inf},
        {"extra": 1},
    ],
)
def test_bad_helper_arguments_are_one_value_error(change: dict[str, object]) -> None:
    raw = json.loads(HelperArgs(1, 3, "h", 1, "p", "gloo", 4, 30.0, 1.5, 3, 3).to_json())
    raw.update(change)
    with pytest.raises((ValueError, TypeError)):
        HelperArgs.from_json(json.dumps(raw))
