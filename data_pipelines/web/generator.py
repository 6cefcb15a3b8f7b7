"""Seeded synthetic web pages from a small layout grammar (the page family of the synthetic world).

Grammar (each choice drawn from ``random.Random(seed)``)::

    page    := nav? hero? body{min_sections..max_sections} footer?
    body    := text | cards | table | features
    nav     := brand link{2..4}              (dark, accent or light bar)
    hero    := title subtitle button?        (left or centred)
    text    := heading paragraph{1..2}
    cards   := heading card{2..max_cards}    (2 or 3 columns; card = title + sentence)
    table   := heading header row{2..max_rows}
    features:= heading item{3..5}            (bulleted list)
    footer  := line link{0..3}

Style: a named palette (background, surface, text, muted, accent, on-accent), a body and a heading font from the
families shipped with Debian's ``fonts-dejavu-core`` and ``fonts-liberation`` (the families the Chromium install
brings; ``fc-list`` on the build machine), base size, corner radius, content width. The HTML is compact (one
``<style>`` block with only the rules the page uses, semantic tags, no scripts, no external resources), so that
tiny models can learn to write it. The ground truth is the :class:`PageSpec` plus the exact HTML string.

``interactive=True`` (off by default, so default pages are byte-identical to earlier ones) adds ``:hover`` and
``:active`` rules for the elements a scroll video can point at (nav links, the hero button, cards, footer links;
``data_pipelines.web.render.INTERACTIVE_SELECTOR``). They only change colours, backgrounds and inset shadows, so a
pointer state repaints the element's own box and nothing else (no layout shift).
"""

from __future__ import annotations

import html as html_lib
import random
from dataclasses import asdict, dataclass, field

WORDS = (
    "able about account action active actual advice agent alpha answer apply area audio balance basic batch "
    "bench better block board bright budget build cache camera canvas carbon central change channel chart "
    "choice circle city clear cloud coast code color common compact course craft create daily data delta "
    "design detail direct domain draft early easy edge energy engine event every expert fabric factor fast "
    "field figure filter final focus forest format frame fresh future garden global golden graph green group "
    "growth guide harbor health helpful history honest hybrid idea image index island journal kernel label "
    "launch layer light linear local logic lunar market matrix method metric mobile modern motion native "
    "network noble ocean office open orbit paper pattern planet plain pocket portal prime private quick quiet "
    "radio rapid reader river robust rocket route safety sample scale screen season secure signal silver "
    "simple smart social solar sound space spring square stable station steady stone story studio summit "
    "system table target team tensor theory timber token total track travel trust unit urban valley vector "
    "vision visual window winter wonder worker yellow zone"
).split()

FONTS = (
    ("DejaVu Sans", "sans-serif"),
    ("DejaVu Serif", "serif"),
    ("Liberation Sans", "sans-serif"),
    ("Liberation Serif", "serif"),
    ("DejaVu Sans Mono", "monospace"),
)


@dataclass(frozen=True)
class Palette:
    name: str
    background: str
    surface: str
    text: str
    muted: str
    accent: str
    on_accent: str


PALETTES = (
    Palette("paper", "#ffffff", "#f3f4f6", "#1f2933", "#616e7c", "#2563eb", "#ffffff"),
    Palette("forest", "#f7faf5", "#e3efdc", "#1d2b1f", "#4b6350", "#2f7d32", "#ffffff"),
    Palette("sunset", "#fffaf3", "#fde7cf", "#3a2418", "#8a5a3c", "#e4572e", "#ffffff"),
    Palette("night", "#111827", "#1f2937", "#f3f4f6", "#9ca3af", "#f59e0b", "#111827"),
    Palette("ocean", "#f0f7fb", "#d6eaf5", "#0b2a3c", "#4a6b80", "#0e7490", "#ffffff"),
    Palette("plum", "#fbf7fc", "#efe2f3", "#2d1633", "#75577d", "#8e3b9e", "#ffffff"),
    Palette("mono", "#fafafa", "#e8e8e8", "#111111", "#555555", "#111111", "#fafafa"),
)


@dataclass(frozen=True)
class PageSizeConfig:
    """How big generated pages get (small by default: the models that learn them are tiny)."""

    min_sections: int = 1
    max_sections: int = 3
    max_cards: int = 4
    max_rows: int = 4
    p_nav: float = 0.85
    p_hero: float = 0.75
    p_footer: float = 0.8

    def __post_init__(self) -> None:
        if not 0 <= self.min_sections <= self.max_sections:
            raise ValueError(f"need 0 <= min_sections <= max_sections, got {self.min_sections}, {self.max_sections}")
        if self.max_cards < 2 or self.max_rows < 2:
            raise ValueError(f"max_cards and max_rows must be >= 2, got {self.max_cards}, {self.max_rows}")


@dataclass
class Section:
    """One node of the grammar: ``kind`` names the production, the other fields hold its text."""

    kind: str  # nav | hero | text | cards | table | features | footer
    heading: str = ""
    texts: list[str] = field(default_factory=list)
    items: list[list[str]] = field(default_factory=list)
    variant: str = ""


@dataclass
class PageSpec:
    """Ground truth of a generated page (``to_html`` turns it into the exact HTML string)."""

    seed: int
    palette: Palette
    font: tuple[str, str]
    heading_font: tuple[str, str]
    base_px: int
    radius_px: int
    width_px: int
    sections: list[Section]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GeneratedPage:
    seed: int
    html: str
    spec: PageSpec
    interactive: bool = False  # the HTML carries :hover / :active rules


def _words(rng: random.Random, lo: int, hi: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]


def _title(rng: random.Random, lo: int = 2, hi: int = 4) -> str:
    return " ".join(w.capitalize() for w in _words(rng, lo, hi))


def _sentence(rng: random.Random, lo: int = 6, hi: int = 12) -> str:
    words = _words(rng, lo, hi)
    return " ".join([words[0].capitalize(), *words[1:]]) + "."


def _body_section(rng: random.Random, kind: str, size: PageSizeConfig) -> Section:
    heading = _title(rng)
    if kind == "text":
        return Section(kind, heading, [" ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
                                       for _ in range(rng.randint(1, 2))])
    if kind == "cards":
        cards = [[_title(rng, 1, 3), _sentence(rng, 4, 9)] for _ in range(rng.randint(2, size.max_cards))]
        return Section(kind, heading, items=cards, variant=rng.choice(["2", "3"]))
    if kind == "table":
        columns = rng.randint(2, 4)
        header = [_title(rng, 1, 1) for _ in range(columns)]
        rows = [[rng.choice(WORDS)] + [str(rng.randint(1, 999)) for _ in range(columns - 1)]
                for _ in range(rng.randint(2, size.max_rows))]
        return Section(kind, heading, items=[header, *rows], variant=rng.choice(["plain", "striped"]))
    return Section("features", heading, texts=[_sentence(rng, 3, 7) for _ in range(rng.randint(3, 5))])


def generate_spec(seed: int, size: PageSizeConfig = PageSizeConfig()) -> PageSpec:
    """Draw a :class:`PageSpec` from the grammar; the same ``seed`` always gives the same spec."""
    rng = random.Random(seed)
    sections: list[Section] = []
    if rng.random() < size.p_nav:
        links = [_title(rng, 1, 1) for _ in range(rng.randint(2, 4))]
        sections.append(Section("nav", _title(rng, 1, 2), links, variant=rng.choice(["dark", "accent", "light"])))
    if rng.random() < size.p_hero:
        button = [_title(rng, 1, 2)] if rng.random() < 0.7 else []
        sections.append(Section("hero", _title(rng, 2, 5), [_sentence(rng), *button],
                                variant=rng.choice(["left", "center"])))
    for _ in range(rng.randint(size.min_sections, size.max_sections)):
        sections.append(_body_section(rng, rng.choice(["text", "cards", "table", "features"]), size))
    if rng.random() < size.p_footer:
        links = [_title(rng, 1, 1) for _ in range(rng.randint(0, 3))]
        sections.append(Section("footer", f"{_title(rng, 1, 2)} {rng.randint(1990, 2030)}", links))
    font = rng.choice(FONTS)
    return PageSpec(
        seed=seed,
        palette=rng.choice(PALETTES),
        font=font,
        heading_font=font if rng.random() < 0.6 else rng.choice(FONTS),
        base_px=rng.choice([13, 14, 15, 16]),
        radius_px=rng.choice([0, 4, 8, 12]),
        width_px=rng.choice([440, 480, 512]),
        sections=sections,
    )


def _css(spec: PageSpec) -> str:
    p, r, kinds = spec.palette, spec.radius_px, {s.kind for s in spec.sections}
    nav_bg = {"dark": p.text, "accent": p.accent, "light": p.surface}
    nav_fg = {"dark": p.background, "accent": p.on_accent, "light": p.text}
    rules = [
        f"body{{margin:0;background:{p.background};color:{p.text};"
        f"font:{spec.base_px}px/1.5 '{spec.font[0]}',{spec.font[1]}}}",
        f"h1,h2,h3{{font-family:'{spec.heading_font[0]}',{spec.heading_font[1]};margin:0 0 8px}}",
        f"main{{max-width:{spec.width_px}px;margin:0 auto;padding:0 16px}}",
        "section{padding:16px 0}p{margin:0 0 8px}",
    ]
    for s in spec.sections:
        if s.kind == "nav":
            rules.append(f"nav{{display:flex;justify-content:space-between;align-items:center;padding:10px 16px;"
                         f"background:{nav_bg[s.variant]};color:{nav_fg[s.variant]}}}nav a{{margin-left:12px}}")
        if s.kind == "hero":
            rules.append(f".hero{{padding:32px 16px;text-align:{s.variant};background:{p.surface}}}"
                         f".hero p{{color:{p.muted}}}")
    if "hero" in kinds:
        rules.append(f".btn{{display:inline-block;padding:6px 14px;border-radius:{r}px;"
                     f"background:{p.accent};color:{p.on_accent}}}")
    if "cards" in kinds:
        rules.append(f".grid{{display:grid;gap:12px}}.c2{{grid-template-columns:1fr 1fr}}"
                     f".c3{{grid-template-columns:1fr 1fr 1fr}}.card{{background:{p.surface};padding:12px;"
                     f"border-radius:{r}px}}.card p{{color:{p.muted}}}")
    if "table" in kinds:
        rules.append(f"table{{width:100%;border-collapse:collapse}}th,td{{text-align:left;padding:4px 8px;"
                     f"border-bottom:1px solid {p.surface}}}th{{color:{p.accent}}}"
                     f".striped tr:nth-child(even){{background:{p.surface}}}")
    if "features" in kinds:
        rules.append(f"li{{margin:4px 0}}li::marker{{color:{p.accent}}}")
    if "footer" in kinds:
        rules.append(f"footer{{padding:16px;background:{p.surface};color:{p.muted};text-align:center}}"
                     "footer a{margin:0 8px}")
    return "".join(rules)


def _interactive_css(spec: PageSpec) -> str:
    """``:hover`` / ``:active`` rules of the elements present: colours, backgrounds and inset shadows only."""
    p, kinds = spec.palette, {s.kind for s in spec.sections}
    ring = f"box-shadow:inset 0 0 0 2px {p.accent}"
    rules = []
    if "nav" in kinds:
        rules.append(f"nav a:hover{{background:{p.background};color:{p.text}}}"
                     f"nav a:active{{background:{p.muted};color:{p.background}}}")
    if "hero" in kinds:
        rules.append(f".btn:hover{{background:{p.on_accent};color:{p.accent};{ring}}}"
                     f".btn:active{{background:{p.muted};color:{p.background}}}")
    if "cards" in kinds:
        rules.append(f".card:hover{{background:{p.background};{ring}}}"
                     f".card:active,.card:active p{{background:{p.accent};color:{p.on_accent}}}")
    if "footer" in kinds:
        rules.append(f"footer a:hover{{background:{p.accent};color:{p.on_accent}}}"
                     f"footer a:active{{background:{p.text};color:{p.background}}}")
    return "".join(rules)


def _section_html(s: Section) -> str:
    e = html_lib.escape
    if s.kind == "nav":
        return f"<nav><b>{e(s.heading)}</b><div>{''.join(f'<a>{e(t)}</a>' for t in s.texts)}</div></nav>"
    if s.kind == "hero":
        button = f"<a class=\"btn\">{e(s.texts[1])}</a>" if len(s.texts) > 1 else ""
        return f"<header class=\"hero\"><h1>{e(s.heading)}</h1><p>{e(s.texts[0])}</p>{button}</header>"
    if s.kind == "footer":
        links = "".join(f"<a>{e(t)}</a>" for t in s.texts)
        return f"<footer><p>{e(s.heading)}</p>{links}</footer>"
    head = f"<section><h2>{e(s.heading)}</h2>"
    if s.kind == "text":
        return head + "".join(f"<p>{e(t)}</p>" for t in s.texts) + "</section>"
    if s.kind == "cards":
        cards = "".join(f"<div class=\"card\"><h3>{e(t)}</h3><p>{e(d)}</p></div>" for t, d in s.items)
        return head + f"<div class=\"grid c{s.variant}\">{cards}</div></section>"
    if s.kind == "table":
        header = "<tr>" + "".join(f"<th>{e(c)}</th>" for c in s.items[0]) + "</tr>"
        rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in s.items[1:])
        return head + f"<table class=\"{s.variant}\">{header}{rows}</table></section>"
    if s.kind == "features":
        return head + "<ul>" + "".join(f"<li>{e(t)}</li>" for t in s.texts) + "</ul></section>"
    raise ValueError(f"unknown section kind {s.kind!r}")


def spec_to_html(spec: PageSpec, interactive: bool = False) -> str:
    """The exact HTML of a spec (deterministic; newline-separated top-level blocks); ``interactive`` adds the
    ``:hover`` / ``:active`` rules after the page's other rules."""
    top = [s for s in spec.sections if s.kind in ("nav", "hero")]
    body = [s for s in spec.sections if s.kind not in ("nav", "hero", "footer")]
    bottom = [s for s in spec.sections if s.kind == "footer"]
    css = _css(spec) + (_interactive_css(spec) if interactive else "")
    lines = [
        "<!DOCTYPE html>",
        f"<html><head><meta charset=\"utf-8\"><style>{css}</style></head><body>",
        *(_section_html(s) for s in top),
        "<main>" + "".join(_section_html(s) for s in body) + "</main>",
        *(_section_html(s) for s in bottom),
        "</body></html>",
    ]
    return "\n".join(lines) + "\n"


def generate_page(seed: int, size: PageSizeConfig = PageSizeConfig(), interactive: bool = False) -> GeneratedPage:
    """A seeded synthetic page: ``GeneratedPage(seed, html, spec)``; same seed, same HTML (byte for byte).

    ``interactive`` adds ``:hover`` / ``:active`` styles (same spec, same layout; see the module docstring).

    >>> page = generate_page(0)
    >>> page.html.startswith("<!DOCTYPE html>")
    True
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    spec = generate_spec(seed, size)
    return GeneratedPage(seed=seed, html=spec_to_html(spec, interactive), spec=spec, interactive=interactive)
