"""How labels look in the plots: one colour family per method family, shades and line styles within it."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: A sequential matplotlib colour map per method family; families not named here take the spare maps in turn.
FAMILY_MAPS = {"reference": "Greys", "data-parallel": "Blues", "data-parallel-compressed": "Oranges",
               "pipeline": "Greens", "local": "Purples"}
SPARE_MAPS = ("Reds", "YlOrBr", "PuRd", "BuGn", "GnBu")
#: Dash patterns (matplotlib on/off lengths; () is solid), cycled within a family.
DASHES = ((), (5, 2), (1, 1.5), (6, 2, 1, 2), (3, 1), (8, 3, 1, 1, 1, 3))
MARKERS = ("o", "s", "^", "D", "v", "P")


@dataclass(frozen=True)
class Style:
    """A label's colour (RGB), dash pattern and marker."""

    color: tuple[float, float, float]
    dashes: tuple[float, ...]
    marker: str


def label_styles(table: pd.DataFrame) -> dict[str, Style]:
    """summary or aggregate (rows with `label` and `family`) -> {label: Style}, labels in order of first appearance.

    The k-th of a family's n labels takes shade 0.85 - 0.45·k/(n-1) of the family's colour map (darkest first; 0.7
    when alone), dash pattern DASHES[k] and marker MARKERS[k] (both cycled), so members of a family share a hue and
    differ in lightness and line style.
    """
    from matplotlib import colormaps

    families = table["family"].fillna("?").astype(str) if "family" in table.columns else pd.Series(
        "?", index=table.index)
    members: dict[str, list[str]] = {}
    for label, family in zip(table["label"].astype(str), families, strict=True):
        for known in members.values():
            if label in known:
                break
        else:
            members.setdefault(family, []).append(label)
    spare = iter(SPARE_MAPS * (1 + len(members) // len(SPARE_MAPS)))
    styles = {}
    for family, labels in members.items():
        cmap = colormaps[FAMILY_MAPS.get(family) or next(spare)]
        for k, label in enumerate(labels):
            shade = 0.7 if len(labels) == 1 else 0.85 - 0.45 * k / (len(labels) - 1)
            red, green, blue, _ = cmap(shade)
            styles[label] = Style((red, green, blue), DASHES[k % len(DASHES)], MARKERS[k % len(MARKERS)])
    return {label: styles[label] for label in pd.unique(table["label"].astype(str))}
