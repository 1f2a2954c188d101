"""HTML pieces of the report: escaped tables, embedded PNG figures, visible token text.

Shared by :mod:`rmfast.analysis.report` and the sections that live beside it
(:mod:`rmfast.analysis.representations.views`).
"""

from __future__ import annotations

import base64
import html

import numpy as np
import pandas as pd


def visible(text) -> str:
    """A decoded token made visible: leading/trailing spaces as ␣, control chars escaped.

    >>> visible(" love\\n")
    '␣love\\\\n'
    """
    s = str(text)
    core = s.strip(" ")
    lead = len(s) - len(s.lstrip(" "))
    trail = len(s) - len(s.rstrip(" ")) if core else 0
    core = "".join(c if c.isprintable() else repr(c)[1:-1] for c in core)
    return "␣" * lead + core + "␣" * trail if s else "∅"


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            return ""
        a = abs(v)
        if a != 0 and (a < 1e-3 or a >= 1e6):
            return f"{v:.2e}"
        return f"{v:.4g}" if a < 1 else f"{v:,.3f}".rstrip("0").rstrip(".")
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return ""
    return str(v)


def table_html(df: pd.DataFrame, *, max_rows: int = 60, text_cols=("text", "word")) -> str:
    """An escaped HTML table (first ``max_rows`` rows; the rest counted)."""
    if df is None or df.empty:
        return '<p class="note">(empty table)</p>'
    shown = df.head(max_rows)
    head = "".join(f'<th class="t">{html.escape(str(c))}</th>' if not pd.api.types.is_numeric_dtype(shown[c])
                   else f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = []
    for rec in shown.itertuples(index=False):
        cells = []
        for c, v in zip(shown.columns, rec):
            val = visible(v) if c in text_cols and isinstance(v, str) else _fmt(v)
            cls = ' class="t"' if isinstance(v, str) else ""
            cells.append(f"<td{cls}>{html.escape(val)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = (f'<p class="note">… {len(df) - max_rows:,} more rows (full table: '
            "<code>rmfast analyze … --out FILE.csv</code>)</p>") if len(df) > max_rows else ""
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>'
            + "".join(rows) + f"</tbody></table></div>{more}")


def img_html(fig, alt: str, width: int | None = None) -> str:
    """A figure as an embedded base64 PNG <img>."""
    from .plots import to_png

    data = base64.b64encode(to_png(fig)).decode("ascii")
    w = f' width="{width}"' if width else ""
    return f'<img alt="{html.escape(alt)}"{w} src="data:image/png;base64,{data}">'
