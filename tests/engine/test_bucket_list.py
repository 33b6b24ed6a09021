"""The bucket-list parser and validator: ranges, steps, and a clear message for every mistake."""

from __future__ import annotations

import pytest

from graphtop.engine.graphs.bucket_list import (
    MAX_BUCKETS,
    BucketSpecError,
    check_buckets,
    format_buckets,
    parse_buckets,
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
    assert parse_buckets(text) == expected


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
        parse_buckets(text)
    assert message in str(err.value)


def test_over_maximum_names_the_limit() -> None:
    with pytest.raises(BucketSpecError, match=r"128 is over max running \(64\)"):
        parse_buckets("1,2,128", maximum=64, maximum_label="max running")
    assert parse_buckets("64", maximum=64) == [64]


def test_range_crossing_maximum_reports_first_value_over() -> None:
    with pytest.raises(BucketSpecError, match="72 is over"):
        parse_buckets("8-128:8", maximum=64)


def test_too_many_buckets() -> None:
    with pytest.raises(BucketSpecError, match="over the limit"):
        parse_buckets(f"1-{MAX_BUCKETS + 1}")
    with pytest.raises(BucketSpecError, match="over the limit"):
        parse_buckets("1-300,301-600")


def test_error_keeps_token() -> None:
    with pytest.raises(BucketSpecError) as err:
        parse_buckets("1,2,zz,4")
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
    parsed = parse_buckets(text)
    assert parse_buckets(format_buckets(parsed)) == parsed


@pytest.mark.parametrize(
    "values, message",
    [
        ([], "decode bucket list is empty"),
        ([0, 2], "decode bucket 0 must be positive"),
        ([1.5], "decode bucket 1.5 is not an integer"),
        ([True], "decode bucket True is not an integer"),
        (
            [[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]],  # a value is quoted at most 40 characters long
            "decode bucket " + "[" * 23 + "]" * 14 + "... is not an integer",
        ),
        ([1, 100, 90], "decode bucket 90 is over the static buffers' maximum (8)"),
    ],
)
def test_check_names_the_first_bad_value(values: list, message: str) -> None:
    with pytest.raises(BucketSpecError) as err:
        check_buckets(values, name="decode bucket", maximum=8, maximum_label="the static buffers' maximum")
    assert str(err.value) == message


def test_text_and_lists_follow_the_same_rules() -> None:
    """The editor's text and a list given to the engine pass or fail together, with one message."""
    assert check_buckets([4, 1, 4, 2]) == parse_buckets("4,1,4,2") == [1, 2, 4]
    for text, values in (("1,2,128", [1, 2, 128]), ("1-100", list(range(1, 101)))):
        with pytest.raises(BucketSpecError) as from_text:
            parse_buckets(text, maximum=64)
        with pytest.raises(BucketSpecError) as from_list:
            check_buckets(values, maximum=64)
        assert str(from_text.value) == str(from_list.value) != ""


def test_a_negative_step_is_named_as_the_step() -> None:
    """``1-8:-1`` said "buckets must be ≥ 1": the buckets were fine, the step was not."""
    with pytest.raises(BucketSpecError, match=r"'1-8:-1': the step must be ≥ 1"):
        parse_buckets("1-8:-1")
    with pytest.raises(BucketSpecError, match="buckets must be ≥ 1"):
        parse_buckets("0-8")


def test_overlapping_ranges_count_once_against_the_limit() -> None:
    """``1-300,1-300`` was "600 buckets, over the limit of 512": the list is 300 buckets."""
    assert parse_buckets("1-300,1-300") == list(range(1, 301))
    assert parse_buckets(f"1-{MAX_BUCKETS} {MAX_BUCKETS}") == list(range(1, MAX_BUCKETS + 1))
    with pytest.raises(BucketSpecError, match=f"over the limit of {MAX_BUCKETS}"):
        parse_buckets(f"1-300,301-{MAX_BUCKETS + 1}")
