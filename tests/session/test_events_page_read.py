"""The events page an answer carries is read without the validator where it holds nothing
(most answers): the same ``EventPage`` as ``EventPage.from_dict`` reads, and every other page,
a wrong one included, is left to it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agentclaims.protocol import EventPage
from agentclaims.session.events import empty_page

_SCALARS = st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats() | st.text(max_size=3)
_PAGES = st.fixed_dictionaries(
    {
        "events": st.just([]) | st.lists(st.just({}), max_size=1) | _SCALARS,
        "last_seq": st.integers(0, 2**40) | _SCALARS,
        "next_since": st.integers(0, 2**40) | _SCALARS,
        "more": st.booleans() | _SCALARS,
        "gap": st.booleans() | _SCALARS,
    },
    optional={"extra": _SCALARS},
)


@given(page=_PAGES)
def test_an_empty_page_reads_as_the_validator_reads_it(page: dict[str, Any]) -> None:
    fast = empty_page(page)
    try:
        checked = EventPage.from_dict(page)
    except (TypeError, ValueError, KeyError):
        assert fast is None  # a page the validator refuses is never read past it
        return
    if fast is not None:
        assert fast == checked
        assert fast.events == ()


@given(last=st.integers(0, 2**40), since=st.integers(0, 2**40), more=st.booleans())
def test_what_the_gateway_writes_of_an_empty_page_takes_the_short_way(
    last: int, since: int, more: bool
) -> None:
    page = EventPage((), last, since, more, False)
    assert empty_page(page.to_dict()) == page
