"""How labels look in the plots: a colour of its own per label, hues grouped by method family, dashes within it."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

#: Families in the order their hue arcs follow round the colour wheel from blue: data-parallel blue, pipelines
#: green, compressed orange and red, local purple; other families after them. The reference family is grey.
FAMILY_ORDER = ("data-parallel", "pipeline", "data-parallel-compressed", "local")
REFERENCE = "reference"
#: Where the wheel starts (HUSL hue, degrees: blue), and HUSL saturation and the lightnesses members alternate.
START_HUE = 250.0
SATURATION = 90.0
LIGHTNESS = (40.0, 60.0, 75.0)
#: Grey levels (RGB) of the reference family's members.
GREYS = (0.2, 0.55, 0.75)
#: Dash patterns (matplotlib on/off lengths; () is solid), cycled within a family.
DASHES = ((), (5, 2), (1, 1.5), (6, 2, 1, 2), (3, 1), (8, 3, 1, 1, 1, 3))
MARKERS = ("o", "s", "^", "D", "v", "P")


@dataclass(frozen=True)
class Style:
    """A label's colour (RGB), dash pattern and marker."""

    color: tuple[float, float, float]
    dashes: tuple[float, ...]
    marker: str


def _members(table: pd.DataFrame) -> dict[str, list[str]]:
    """{family: its labels in order of first appearance}, each label once (in its first family)."""
    families = table["family"].fillna("?").astype(str) if "family" in table.columns else pd.Series(
        "?", index=table.index)
    members: dict[str, list[str]] = {}
    seen: set[str] = set()
    for label, family in zip(table["label"].astype(str), families, strict=True):
        if label not in seen:
            seen.add(label)
            members.setdefault(family, []).append(label)
    return members


def label_styles(table: pd.DataFrame) -> dict[str, Style]:
    """summary or aggregate (rows with `label` and `family`) -> {label: Style}, labels in order of first appearance.

    Every label but the reference family's gets its own hue: the labels, grouped by family in FAMILY_ORDER (then
    other families), share the wheel evenly from START_HUE downwards, with half a step between families, so that a
    family is one arc of neighbouring hues and no two labels share one. Neighbouring labels also cycle through
    LIGHTNESS (so two of one lightness are at least len(LIGHTNESS) hue steps apart), and members of a family through
    dash patterns and markers (DASHES[k], MARKERS[k]). HUSL keeps the lightness even across hues.
    Reference labels are greys.
    """
    from seaborn.external import husl

    members = _members(table)
    order = [f for f in FAMILY_ORDER if f in members] + [f for f in members if f not in FAMILY_ORDER + (REFERENCE,)]
    slots = sum(len(members[f]) for f in order) + 0.5 * len(order)
    step = 360.0 / slots if slots else 0.0
    styles: dict[str, Style] = {}
    position, index = 0.0, 0
    for family in order:
        for k, label in enumerate(members[family]):
            hue = (START_HUE - step * position) % 360.0
            red, green, blue = husl.husl_to_rgb(hue, SATURATION, LIGHTNESS[index % len(LIGHTNESS)])
            index += 1
            styles[label] = Style((_unit(red), _unit(green), _unit(blue)), DASHES[k % len(DASHES)],
                                  MARKERS[k % len(MARKERS)])
            position += 1.0
        position += 0.5
    for k, label in enumerate(members.get(REFERENCE, [])):
        grey = GREYS[k % len(GREYS)]
        styles[label] = Style((grey, grey, grey), DASHES[k % len(DASHES)], MARKERS[k % len(MARKERS)])
    return {label: styles[label] for label in pd.unique(table["label"].astype(str))}


def _unit(value: float) -> float:
    """A colour channel clipped to [0, 1] (HUSL's conversion can step a hair outside)."""
    return min(1.0, max(0.0, float(value)))
