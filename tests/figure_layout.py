"""What a person calls *cut* or *overlapping*, measured in the browser (Playwright).

:data:`FIGURE_PROBLEMS_JS` reads every drawn plotly figure of a page: the bounding boxes of its
title, subplot titles and other annotations, axis titles, each axis's tick labels, the legend and
the colour bar, and reports any of them that leaves the figure (is cut) or overlaps another (two
boxes sharing more than a few pixels). :data:`CUT_TEXT_JS` reports the page's own text that its box
cuts: a label or a button whose text is wider than the box that shows it (Streamlit ellipsises or
scrolls it). The mode bar, where it is drawn, must not cover the title or a subplot title, and
tick labels keep one notation (no SI prefixes, no log-axis minor digits out of order).
Both return lists of one-line descriptions; empty is good.
"""

from __future__ import annotations

FIGURE_PROBLEMS_JS = r"""
() => {
  const out = [];
  const plots = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.offsetParent);
  plots.forEach((plot, k) => {
    const svg = plot.querySelector('svg.main-svg');
    if (!svg) return;
    const F = svg.getBoundingClientRect();
    const name = (plot.querySelector('.gtitle')?.textContent || `figure ${k}`).slice(0, 50);
    const parts = [];
    const add = (label, els) => {
      const boxes = [...els].map(e => e.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0);
      if (!boxes.length) return;
      boxes.forEach(r => parts.push({label, r}));
    };
    const union = (label, els) => {
      const boxes = [...els].map(e => e.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0);
      if (!boxes.length) return;
      const r = {left: Math.min(...boxes.map(b => b.left)), top: Math.min(...boxes.map(b => b.top)),
                 right: Math.max(...boxes.map(b => b.right)), bottom: Math.max(...boxes.map(b => b.bottom))};
      const flat = [...els].filter(e => !(e.getAttribute('transform') || '').includes('rotate'))
        .map(e => e.getBoundingClientRect()).filter(r => r.width > 0 && r.height > 0);
      parts.push({label, r, each: boxes, flat});
    };
    add('title', plot.querySelectorAll('.gtitle'));
    plot.querySelectorAll('.annotation').forEach(a => {
      const label = 'annotation "' + (a.textContent || '').slice(0, 30) + '"';
      add(label, [a.querySelector('.annotation-text-g') || a]);
    });
    add('x title', plot.querySelectorAll('.g-xtitle, .g-x2title, .g-x3title, .g-x4title'));
    add('y title', plot.querySelectorAll('.g-ytitle, .g-y2title, .g-y3title, .g-y4title'));
    plot.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach((g, i) =>
      union('ticks ' + i, g.querySelectorAll('text')));
    // the numbers written in heatmap cells, each its own box
    const cells = [...plot.querySelectorAll('.heatmaplayer text, .textpoint text')]
      .map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
    for (let i = 1; i < cells.length; i++) for (let j = 0; j < i; j++) {
      const a = cells[i], b = cells[j];
      if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
          && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1) {
        out.push(`${name}: the numbers in the heatmap's cells overprint each other`); i = cells.length; break;
      }
    }
    add('legend', plot.querySelectorAll('.legend .bg'));
    add('colorbar', plot.querySelectorAll('.colorbar'));
    // the mode bar (plotly's toolbar), where it is shown: it must not cover a title (with a mouse it
    // shows only while the pointer is over the figure; a touch screen would show it always)
    const bar = [...plot.querySelectorAll('.modebar-container')]
      .filter(e => getComputedStyle(e).display !== 'none')
      .map(e => e.querySelector('.modebar') || e)
      .filter(e => [...e.querySelectorAll('.modebar-group')]
        .some(g => parseFloat(getComputedStyle(g).opacity) > 0))
      .map(e => e.getBoundingClientRect())
      .filter(r => r.width > 0 && r.height > 0);
    bar.forEach(r => parts.filter(p => p.label === 'title' || p.label.startsWith('annotation')).forEach(p => {
      const w = Math.min(r.right, p.r.right) - Math.max(r.left, p.r.left);
      const h = Math.min(r.bottom, p.r.bottom) - Math.max(r.top, p.r.top);
      if (w > 2 && h > 2) out.push(`${name}: the mode bar covers the ${p.label}`);
    }));
    // tick labels in one notation: no SI prefixes ("1µ", "100m") and, in reading order, no minor
    // digits restarting a log axis ("2 5 10 2 5")
    plot.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach((g, i) => {
      const ticks = [...g.querySelectorAll('text')].map(e => ({t: (e.textContent || '').trim(),
        r: e.getBoundingClientRect()})).filter(x => x.t && x.r.width > 0);
      if (ticks.some(x => /^[−-]?[\d.]+[µmnpfkMGT]$/.test(x.t)))
        out.push(`${name}: SI-prefixed tick labels on axis ${i} (${ticks.map(x => x.t).join(' ')})`);
      const horizontal = g.classList.contains('xaxislayer-above');
      const nums = ticks.filter(x => /^[−-]?\d+(\.\d+)?$/.test(x.t))
        .sort((a, b) => horizontal ? a.r.left - b.r.left : b.r.top - a.r.top)
        .map(x => parseFloat(x.t.replace('−', '-')));
      const up = nums.every((v, j) => j === 0 || v > nums[j - 1]);
      const down = nums.every((v, j) => j === 0 || v < nums[j - 1]);
      if (nums.length > 2 && !up && !down)
        out.push(`${name}: tick labels out of order on axis ${i} (${ticks.map(x => x.t).join(' ')})`);
    });
    // cut: a text box outside the figure
    parts.forEach(p => {
      const r = p.r, tol = 2;
      const outside = r.left < F.left - tol || r.right > F.right + tol || r.top < F.top - tol
        || r.bottom > F.bottom + tol;
      if (outside) out.push(`${name}: ${p.label} is cut by the figure's edge`);
    });
    // tick labels of one axis overlapping each other (not rotated ones: their boxes are not their glyphs)
    parts.filter(p => p.each && p.label.startsWith('ticks')).forEach(p => {
      const b = p.flat;
      for (let i = 0; i < b.length; i++) for (let j = i + 1; j < b.length; j++) {
        const w = Math.min(b[i].right, b[j].right) - Math.max(b[i].left, b[j].left);
        const h = Math.min(b[i].bottom, b[j].bottom) - Math.max(b[i].top, b[j].top);
        if (w > 2 && h > 2) { out.push(`${name}: tick labels overlap (${p.label})`); return; }
      }
    });
    // any two parts overlapping (tick labels of different axes may touch at a corner)
    for (let i = 0; i < parts.length; i++) for (let j = i + 1; j < parts.length; j++) {
      const a = parts[i], b = parts[j];
      if (a.label === b.label) continue;
      const A = a.each || [a.r], B = b.each || [b.r];
      // two axes' tick labels meet at the plot's corner: their boxes may share a few pixels
      const tol = a.each && b.each ? 8 : 3;
      let hit = false;
      for (const x of A) for (const y of B) {
        const w = Math.min(x.right, y.right) - Math.max(x.left, y.left);
        const h = Math.min(x.bottom, y.bottom) - Math.max(x.top, y.top);
        if (w > tol && h > tol) hit = true;
      }
      if (hit) out.push(`${name}: ${a.label} overlaps ${b.label}`);
    }
  });
  return [...new Set(out)];
}
"""

CUT_TEXT_JS = r"""
() => {
  const out = [];
  const main = document.querySelector('[data-testid="stMain"]') || document.body;
  const skip = '.js-plotly-plot, [data-testid="stDataFrame"], [data-testid="stCode"], pre, code, svg, '
    + '.katex-mathml';   // KaTeX's copy for screen readers is clipped to 1 px on purpose
  for (const e of main.querySelectorAll('*')) {
    if (!e.offsetParent || !(e instanceof HTMLElement) || e.closest(skip) || e.querySelector(skip)) continue;
    const s = getComputedStyle(e);
    const clips = s.overflowX !== 'visible' || s.textOverflow === 'ellipsis';
    const text = (e.innerText || '').trim();
    if (clips && text && e.scrollWidth > e.clientWidth + 1)
      out.push(`"${text.slice(0, 40)}" is cut (${e.clientWidth}px shows ${e.scrollWidth}px)`);
  }
  return [...new Set(out)];
}
"""
