"""The pool sizes in order, checked once (records/shape.py): 0 < top-k <= capacity <= host <=
experts over those given, refused in one line that names where and the bound that fails."""

from __future__ import annotations

import pytest

from moecache.config.keys import ConfigError
from moecache.errors import MoecacheError
from moecache.records.shape import check_shape


@pytest.mark.parametrize(
    ("sizes", "says"),
    [
        ((2, 4, 8, 6), None),
        ((2, 4, 8, None), None),
        ((None, 4, None, None), None),
        ((4, 3, 8, None), "here: top-k 4 is larger than capacity 3 (need 0 < top-k 4 <="),
        ((2, 9, 8, None), "here: capacity 9 is larger than experts 8"),
        ((None, 4, 8, 3), "here: capacity 4 is larger than host 3"),
        ((None, 4, 8, 9), "here: host 9 is larger than experts 8"),
        ((0, 4, 8, None), "here: top-k 0 is below 1"),
        ((None, 0, 8, None), "here: capacity 0 is below 1"),
    ],
)
def test_sizes_out_of_order_are_one_line_naming_the_bound(sizes, says):
    top_k, capacity, experts, host = sizes
    if says is None:
        check_shape(top_k, capacity, experts, host, where="here")
        return
    with pytest.raises(MoecacheError) as caught:
        check_shape(top_k, capacity, experts, host, where="here")
    assert str(caught.value).startswith(says) and "\n" not in str(caught.value)


def test_a_config_key_is_a_config_error_with_its_note():
    with pytest.raises(ConfigError, match=r"^config key k: top-k 4 .* experts 8\); why$"):
        check_shape(4, 3, 8, where="config key k", error=ConfigError, note="why")
