"""The bucket-list parser and validator: ranges, steps, and a clear message for every mistake."""

from __future__ import annotations

import pytest

from graphtop.engine.graphs.bucket_list import (
    MAX_BUCKETS,
    BucketList,
    BucketSpecError,
    format_buckets,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1,2,4,8-64:8", [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]),
        ("1-4", [1, 2, 3, 4]),
        ("4", [4]),
        ("8, 4 ,2,1", [1, 2, 4, 8]),
        ("1 2 4", [1, 2, 4]),
        ("4,4,1-4", [1, 2, 3, 4]),
        ("8-20:8", [8, 16]),  # the end need not be on the step
        ("5-5", [5]),
        ("+3", [3]),
        ("  16-32:16 , ", [16, 32]),
    ],
)
def test_parses(text: str, expected: list[int]) -> None:
    assert BucketList.parse(text).as_list() == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("  ,  ", "empty"),
        ("x", "'x' is not an integer"),
        ("1,2.5", "'2.5' is not an integer"),
        ("0", "'0': buckets must be ≥ 1"),
        ("-4", "'-4': buckets must be ≥ 1"),
        ("0-8", "'0-8': buckets must be ≥ 1"),
        ("8-4", "'8-4': bad range, 4 is below 8"),
        ("8-", "'8-': bad range"),
        ("-", "bad range"),
        ("8-64:0", "the step must be ≥ 1"),
        ("8-64:x", "'x' is not an integer"),
        ("4:2", "a step needs a range"),
        ("a-8", "'a' is not an integer"),
    ],
)
def test_errors_name_the_token(text: str, message: str) -> None:
    with pytest.raises(BucketSpecError) as err:
        BucketList.parse(text).as_list()
    assert message in str(err.value)


def test_over_maximum_names_the_limit() -> None:
    with pytest.raises(BucketSpecError, match=r"128 is over max running \(64\)"):
        BucketList.parse("1,2,128", maximum=64, maximum_label="max running").as_list()
    assert BucketList.parse("64", maximum=64).as_list() == [64]


def test_range_crossing_maximum_reports_first_value_over() -> None:
    with pytest.raises(BucketSpecError, match="72 is over"):
        BucketList.parse("8-128:8", maximum=64).as_list()


def test_too_many_buckets() -> None:
    with pytest.raises(BucketSpecError, match="over the limit"):
        BucketList.parse(f"1-{MAX_BUCKETS + 1}").as_list()
    with pytest.raises(BucketSpecError, match="over the limit"):
        BucketList.parse("1-300,301-600").as_list()


def test_error_keeps_token() -> None:
    with pytest.raises(BucketSpecError) as err:
        BucketList.parse("1,2,zz,4").as_list()
    assert err.value.token == "zz"


@pytest.mark.parametrize(
    "buckets, text",
    [
        ([1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], "1,2,4,8-64:8"),
        ([1, 2, 3, 4], "1-4"),
        ([1, 2], "1,2"),
        ([64, 128, 256, 512], "64,128,256,512"),
        ([], ""),
    ],
)
def test_format(buckets: list[int], text: str) -> None:
    assert format_buckets(buckets) == text


@pytest.mark.parametrize("text", ["1,2,4,8-64:8", "1-100", "3,5,7,9,100,200,300", "1", "2,3,5,8,13,21"])
def test_round_trip(text: str) -> None:
    parsed = BucketList.parse(text).as_list()
    assert BucketList.parse(format_buckets(parsed)).as_list() == parsed


@pytest.mark.parametrize(
    "values, message",
    [
        ([], "empty: give at least one bucket, e.g. 1,2,4,8-64:8"),
        ([0, 2], "'0': buckets must be ≥ 1"),
        ([1.5], "'1.5' is not an integer"),
        ([True], "'True' is not an integer"),
        (
            [[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]],  # a value is quoted at most 40 characters long
            "'" + "[" * 23 + "]" * 14 + "...' is not an integer",
        ),
        ([1, 100, 90], "bucket 90 is over the static buffers' maximum (8)"),
        (
            [10**19],
            "'10000000000000000000': a 20-digit number, over the largest a list takes (999,999,999,999,999,999)",
        ),
    ],
)
def test_a_list_names_the_first_bad_value(values: list, message: str) -> None:
    with pytest.raises(BucketSpecError) as err:
        BucketList(values, maximum=8, maximum_label="the static buffers' maximum")
    assert str(err.value) == message


def test_a_bucket_list_is_sorted_unique_and_frozen() -> None:
    buckets = BucketList([8, 1, 4, 1])
    assert buckets.sizes == (1, 4, 8) and list(buckets) == [1, 4, 8] and len(buckets) == 3 and buckets[-1] == 8
    assert buckets == BucketList.parse("1,4,8") and str(buckets) == "1,4,8"
    with pytest.raises(AttributeError):
        buckets.sizes = (2,)  # type: ignore[misc]


def test_text_and_lists_follow_the_same_rules() -> None:
    """The editor's text and a list given to the engine pass or fail together, with one message."""
    assert BucketList([4, 1, 4, 2]).as_list() == BucketList.parse("4,1,4,2").as_list() == [1, 2, 4]
    cases = (("1,2,128", [1, 2, 128]), ("1-100", list(range(1, 101))), ("1,0,4", [1, 0, 4]), ("4,x", [4, "x"]))
    for text, values in cases + (("", []), ("1," + "9" * 20, [1, 10**20 - 1])):
        with pytest.raises(BucketSpecError) as from_text:
            BucketList.parse(text, maximum=64)
        with pytest.raises(BucketSpecError) as from_list:
            BucketList(values, maximum=64)
        assert str(from_text.value) == str(from_list.value) != ""


def test_a_negative_step_is_named_as_the_step() -> None:
    """``1-8:-1`` said "buckets must be ≥ 1": the buckets were fine, the step was not."""
    with pytest.raises(BucketSpecError, match=r"'1-8:-1': the step must be ≥ 1"):
        BucketList.parse("1-8:-1").as_list()
    with pytest.raises(BucketSpecError, match="buckets must be ≥ 1"):
        BucketList.parse("0-8").as_list()


def test_overlapping_ranges_count_once_against_the_limit() -> None:
    """``1-300,1-300`` was "600 buckets, over the limit of 512": the list is 300 buckets."""
    assert BucketList.parse("1-300,1-300").as_list() == list(range(1, 301))
    assert BucketList.parse(f"1-{MAX_BUCKETS} {MAX_BUCKETS}").as_list() == list(range(1, MAX_BUCKETS + 1))
    with pytest.raises(BucketSpecError, match=f"over the limit of {MAX_BUCKETS}"):
        BucketList.parse(f"1-300,301-{MAX_BUCKETS + 1}").as_list()
