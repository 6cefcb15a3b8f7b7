"""Text-block detection by recolouring, checked against the browser's own text geometry."""

from __future__ import annotations

import numpy as np

from data_pipelines.web import Viewport
from data_pipelines.web.generator import generate_page
from eval.web_metric.blocks import COLOUR_OFFSET, LATTICE_STEP, analyze_page, label_text_pixels

DOM_TEXT_RECTS_JS = """(() => {
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    let box = null, text = '';
    for (const node of el.childNodes) {
      if (node.nodeType !== 3 || !node.textContent.trim()) continue;
      text += node.textContent;
      const range = document.createRange(); range.selectNodeContents(node);
      for (const r of range.getClientRects()) {
        box = box ? [Math.min(box[0], r.left), Math.min(box[1], r.top), Math.max(box[2], r.right),
                     Math.max(box[3], r.bottom)] : [r.left, r.top, r.right, r.bottom];
      }
    }
    if (box) out.push([text.replace(/\\s+/g, ' ').trim(), box]);
  }
  return out;
})()"""


def test_label_text_pixels_on_synthetic_renders() -> None:
    a = np.full((20, 30, 3), 255, np.uint8)
    colour = np.array([0, 1, 2]) * LATTICE_STEP  # element 12
    a[5:8, 4:10] = colour
    a[4, 4:10] = 200  # anti-aliased edge, changes a little between renders
    b = a.copy()
    b[5:8, 4:10] = colour + COLOUR_OFFSET
    b[4, 4:10] = 210
    labels, core = label_text_pixels(a, b, n_elements=13)
    assert core.sum() == 18 and (labels[5:8, 4:10] == 12).all() and (labels[4, 4:10] == 12).all()
    assert (labels[labels != 12] == -1).all()
    labels, core = label_text_pixels(a, b, n_elements=12)  # index out of range -> no text
    assert not core.any() and (labels == -1).all()


def test_every_text_element_found_where_the_browser_puts_it(browser) -> None:
    for seed in (1, 4):
        html = generate_page(seed).html
        analysis = analyze_page(html, browser, Viewport(512, 384), 4096)
        assert len(analysis.blocks) == analysis.n_text_elements > 5
        browser.load_html(html, Viewport(512, analysis.size[1]))
        dom = browser.evaluate(DOM_TEXT_RECTS_JS)
        assert [b.text for b in analysis.blocks] == [t for t, _ in dom]
        for block, (_, (x0, y0, x1, y1)) in zip(analysis.blocks, dom):
            # Glyph ink lies inside the line box: allow the line box's leading above and below.
            assert x0 - 2 <= block.x0 and block.x1 <= x1 + 2, (block, (x0, x1))
            assert y0 - 2 <= block.y0 and block.y1 <= y1 + 2, (block, (y0, y1))
            assert block.x1 - block.x0 >= 0.6 * (x1 - x0), (block, (x0, x1))
