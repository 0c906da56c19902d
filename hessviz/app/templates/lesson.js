(function () {
  const L = JSON.parse(document.getElementById('lesson-data').textContent);
  const state = L.controls.map(() => 0);
  const charts = document.getElementById('charts');
  const phone = () => window.innerWidth < 700;
  window.lessonRedraws = 0;
  function layout(f) {
    const l = Object.assign({}, f.layout, {template: L.template, autosize: true});
    if (phone()) {      // the figures' own legend sits at the bottom of the chart: keep it, narrow the sides
      l.height = Math.min(l.height || 460, 460);
      l.margin = Object.assign({}, l.margin || {}, {l: 55, r: 10});
      l.legend = Object.assign({}, l.legend || {}, {font: {size: 12}});
    }
    return l;
  }
  function show() {
    const t0 = performance.now();
    const v = L.views[state.join('|')];
    const err = document.getElementById('error');
    const lines = document.getElementById('lines');
    if (!v || v.error) {
      err.hidden = false; err.textContent = v ? v.error : 'Not in this lesson page.';
      return;
    }
    err.hidden = true;
    document.getElementById('describe').textContent = v.describe;
    lines.innerHTML = '';
    v.lines.forEach((t) => {
      const p = document.createElement('p'); p.textContent = t; lines.appendChild(p);
    });
    v.figures.forEach((f, i) => {      // every chart's place first: the grid then sizes them all
      if (!document.getElementById('chart' + i)) {
        const div = document.createElement('div'); div.id = 'chart' + i; div.className = 'chart';
        charts.appendChild(div);
      }
    });
    const done = v.figures.map((k, i) => {    // a chart whose figure did not change is left as it is
      const div = document.getElementById('chart' + i);
      if (div.dataset.figure === String(k)) return Promise.resolve();
      div.dataset.figure = String(k);
      const f = L.figures[k];
      return Plotly.react(div, f.data, layout(f), Object.assign({responsive: true}, L.config));
    });
    Promise.all(done).then(() => {
      window.lessonRedraws += 1; window.lessonLastRedrawMs = performance.now() - t0;
    });
  }
  L.controls.forEach((c, i) => {
    if (c.slider) {
      const input = document.getElementById('c' + i);
      input.addEventListener('input', () => {
        state[i] = +input.value; document.getElementById('o' + i).textContent = c.texts[state[i]]; show();
      });
    } else {
      document.querySelectorAll('fieldset[data-control="' + i + '"] input').forEach((input) => {
        input.addEventListener('change', () => { state[i] = +input.value; show(); });
      });
    }
  });
  show();
})();
