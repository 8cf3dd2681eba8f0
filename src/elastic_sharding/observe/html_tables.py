"""The report's tables: one helper renders a table from its columns and its rows' items.

A column says how to show an item (HTML, already escaped) and, for a numeric column, the number
behind it: numeric columns are right-aligned and sort by that number (`data-sort`, empty when
there is none), other columns by their text unless they give a sort key. A table with no rows is
a "None." paragraph. The page's script sorts a `sortable` table when a header is clicked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from elastic_sharding.observe.html_format import esc, num

T = TypeVar("T")


@dataclass(frozen=True)
class Column(Generic[T]):
    header: str
    html: Callable[[T], str]
    value: Callable[[T], object] | None = None  # a numeric column: the number to sort by
    sort: Callable[[T], object] | None = None  # a text column's sort key, when not its text
    cls: str | Callable[[T], str] = ""  # the cells' class, or a function of the item giving it
    title: str = ""  # the header's tooltip

    def th(self) -> str:
        cls = " class=num" if self.value is not None else ""
        title = f' title="{esc(self.title)}"' if self.title else ""
        return f"<th{cls}{title}>{esc(self.header)}</th>"

    def td(self, item: T) -> str:
        if self.value is not None:
            figure = num(self.value(item))
            cls, sort = "num", "" if figure is None else repr(figure)
        else:
            cls = self.cls(item) if callable(self.cls) else self.cls
            sort = None if self.sort is None else self.sort(item)
        cls_attr = f' class="{cls}"' if cls else ""
        sort_attr = f' data-sort="{esc(sort)}"' if sort is not None else ""
        return f"<td{cls_attr}{sort_attr}>{self.html(item)}</td>"


def number(header: str, key: str, fmt: Callable[[Any], str], title: str = "") -> Column[dict[str, Any]]:
    """A numeric column showing `fmt` of the item's `key`."""
    return Column(header, lambda item: fmt(item.get(key)), value=lambda item: item.get(key), title=title)


def table(
    columns: Sequence[Column[T]], items: Iterable[T], shard: Callable[[T], object] | None = None, sortable: bool = False
) -> str:
    """The table of `items`, one row each; `shard` names a row's shard (`data-shard`, for highlighting)."""
    rows = []
    for item in items:
        shard_attr = f' data-shard="{esc(shard(item))}"' if shard is not None else ""
        rows.append(f"<tr{shard_attr}>" + "".join(column.td(item) for column in columns) + "</tr>")
    if not rows:
        return '<p class="none">None.</p>'
    head = "".join(column.th() for column in columns)
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


__all__ = ["Column", "number", "table"]
