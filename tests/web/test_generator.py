"""Page generator: determinism, grammar coverage, size, validation (no browser needed)."""

from __future__ import annotations

import pytest

from data_pipelines.web.generator import PageSizeConfig, generate_page, generate_spec, spec_to_html


def test_same_seed_same_html_and_different_seeds_differ() -> None:
    assert generate_page(7).html == generate_page(7).html
    assert len({generate_page(s).html for s in range(20)}) == 20


def test_grammar_covers_every_production() -> None:
    kinds = {sec.kind for s in range(60) for sec in generate_spec(s).sections}
    assert kinds == {"nav", "hero", "text", "cards", "table", "features", "footer"}
    palettes = {generate_spec(s).palette.name for s in range(60)}
    fonts = {generate_spec(s).font[0] for s in range(60)}
    assert len(palettes) >= 5 and len(fonts) >= 4


def test_pages_are_small_static_and_well_formed() -> None:
    for seed in range(30):
        page = generate_page(seed)
        assert len(page.html) < 4000, f"seed {seed}: {len(page.html)} chars"
        assert page.html.startswith("<!DOCTYPE html>") and page.html.rstrip().endswith("</body></html>")
        assert "<script" not in page.html and "http" not in page.html
        assert spec_to_html(page.spec) == page.html
        assert page.spec.to_dict()["seed"] == seed


def test_size_config_bounds_sections() -> None:
    size = PageSizeConfig(min_sections=2, max_sections=2, p_nav=0.0, p_hero=0.0, p_footer=0.0)
    for seed in range(10):
        assert len(generate_spec(seed, size).sections) == 2


def test_invalid_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="seed"):
        generate_page(-1)
    with pytest.raises(ValueError, match="min_sections"):
        PageSizeConfig(min_sections=3, max_sections=1)
