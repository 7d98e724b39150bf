/* Figures with sliders that work on the published book, without a Python kernel.
 *
 * A chapter asks for one with an empty element (invisible in Jupyter, where the chapter's
 * ipywidgets sliders do the same job):
 *
 *   <div class="gptbook-figure" data-figure="positional-encoding" data-positions="128"
 *        data-d-model="64" data-position="5" data-dimension="10"></div>
 *   <div class="gptbook-figure" data-figure="scaling" data-keys="16" data-d-k="64"></div>
 *   <div class="gptbook-figure" data-figure="temperature" data-scores="[2, 1, 0.1, -1, 0.5]"
 *        data-labels='["a", "b", "c", "d", "e"]'></div>
 *
 * Each recomputes its closed-form maths in the page when a slider moves: the sinusoidal table
 * (chapter 3), softmax of dot products with and without the 1/√d_k scaling (chapter 5) and
 * softmax with a temperature (chapter 6).
 */
(function (global) {
  "use strict";

  const book = global.GPTBook;
  const { el, svgEl, softmax } = book; // from gpt-common.js
  const BAR = "#3b6ea8";

  /** Blue (-1) - white (0) - red (+1), for signed values. */
  function signedColour(v) {
    const t = Math.max(-1, Math.min(1, v));
    const mix = (a, b, s) => Math.round(a + (b - a) * s);
    if (t >= 0) return [mix(247, 178, t), mix(247, 24, t), mix(247, 43, t)];
    return [mix(247, 33, -t), mix(247, 102, -t), mix(247, 172, -t)];
  }

  /** A slider with a label and its current value; onInput(value) runs on every move. */
  function slider(label, { min, max, step = 1, value, format = String }, onInput) {
    const input = el("input", { type: "range", min, max, step, value });
    const output = el("output", {}, format(Number(value)));
    input.addEventListener("input", () => {
      output.textContent = format(Number(input.value));
      onInput(Number(input.value));
    });
    return { row: el("label", { class: "gptbook-slider" }, el("span", {}, label), input, output), input };
  }

  /**
   * A bar chart in an <svg>: values with labels, fixed y range, a title. `outline` (optional) draws
   * a second set of values as hollow bars for comparison.
   */
  function barChart(svg, { values, labels, ymin = 0, ymax = 1, title, xlabel, highlight, outline, width = 420, height = 230 }) {
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const left = 40;
    const right = 8;
    const top = 24;
    const bottom = labels ? 52 : 36;
    const w = (width - left - right) / values.length;
    const y = (v) => top + ((ymax - v) / (ymax - ymin)) * (height - top - bottom);
    svg.append(svgEl("text", { x: width / 2, y: 15, "text-anchor": "middle", class: "gptbook-title" }, title));
    for (const tick of [ymin, (ymin + ymax) / 2, ymax]) {
      svg.append(svgEl("line", { x1: left, x2: width - right, y1: y(tick), y2: y(tick), class: "gptbook-grid" }));
      svg.append(svgEl("text", { x: left - 4, y: y(tick) + 4, "text-anchor": "end", class: "gptbook-tick" }, String(+tick.toFixed(2))));
    }
    values.forEach((v, i) => {
      const colour = Array.isArray(v) ? null : BAR;
      const value = Array.isArray(v) ? v[0] : v;
      const fill = Array.isArray(v) ? `rgb(${v[1].join(",")})` : colour;
      const y0 = y(Math.max(ymin, Math.min(0, ymax)));
      const y1 = y(value);
      svg.append(
        svgEl("rect", {
          x: left + i * w + w * 0.1,
          y: Math.min(y0, y1),
          width: w * 0.8,
          height: Math.max(0.5, Math.abs(y1 - y0)),
          fill,
          stroke: i === highlight ? "currentColor" : "none", // the page's text colour: dark mode too
          "stroke-width": 1.5,
        }),
      );
      if (outline) {
        const yo = y(outline[i]);
        svg.append(svgEl("rect", { x: left + i * w + w * 0.1, y: Math.min(y0, yo), width: w * 0.8, height: Math.max(0.5, Math.abs(yo - y0)), class: "gptbook-outline" }));
      }
      if (labels) {
        const x = left + i * w + w / 2;
        svg.append(svgEl("text", { x, y: height - bottom + 14, "text-anchor": "end", transform: `rotate(-35 ${x} ${height - bottom + 14})`, class: "gptbook-tick" }, labels[i]));
      }
    });
    if (xlabel) svg.append(svgEl("text", { x: width / 2, y: height - 4, "text-anchor": "middle", class: "gptbook-tick" }, xlabel));
  }

  // ---- chapter 3: the sinusoidal positional encoding ------------------------------------------

  function positionalEncoding(root) {
    const T = Number(root.dataset.positions || 128);
    const C = Number(root.dataset.dModel || 64);
    const base = Number(root.dataset.base || 10000);
    const table = Array.from({ length: T }, (_, pos) => book.sinusoidalPosition(pos, C, base));
    let position = Number(root.dataset.position || 5);
    let dimension = Number(root.dataset.dimension || 10);

    // the whole table, drawn once on a canvas; the chosen row/column are drawn over it in SVG
    const canvas = el("canvas", { width: C, height: T, class: "gptbook-pe-canvas" });
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(C, T);
    table.forEach((row, pos) =>
      row.forEach((v, d) => {
        const [r, g, b] = signedColour(v);
        image.data.set([r, g, b, 255], (pos * C + d) * 4);
      }),
    );
    ctx.putImageData(image, 0, 0);
    const marks = svgEl("svg", { viewBox: `0 0 ${C} ${T}`, preserveAspectRatio: "none", class: "gptbook-pe-marks" });
    const rowBar = svgEl("svg", { class: "gptbook-chart" });
    const wave = svgEl("svg", { class: "gptbook-chart" });

    function draw() {
      marks.replaceChildren(
        svgEl("line", { x1: 0, x2: C, y1: position + 0.5, y2: position + 0.5, class: "gptbook-mark" }),
        svgEl("line", { x1: dimension + 0.5, x2: dimension + 0.5, y1: 0, y2: T, class: "gptbook-mark gptbook-dashed" }),
      );
      const row = Array.from(table[position]);
      barChart(rowBar, {
        values: row.map((v) => [v, signedColour(v)]),
        ymin: -1.1,
        ymax: 1.1,
        highlight: dimension,
        title: `The vector of position ${position}`,
        xlabel: "dimension",
      });
      const column = table.map((r) => r[dimension]);
      const wavelength = 2 * Math.PI * base ** ((dimension - (dimension % 2)) / C);
      const kind = dimension % 2 === 0 ? "sin" : "cos";
      lineChart(wave, column, position, `Dimension ${dimension} (${kind}, wavelength ${wavelength.toFixed(1)}) over positions`);
      root.dataset.state = `${position},${dimension}`;
    }

    const posSlider = slider("position", { min: 0, max: T - 1, value: position }, (v) => {
      position = v;
      draw();
    });
    const dimSlider = slider("dimension", { min: 0, max: C - 1, value: dimension }, (v) => {
      dimension = v;
      draw();
    });
    posSlider.input.classList.add("gptbook-position");
    dimSlider.input.classList.add("gptbook-dimension");
    const tableBox = el(
      "div",
      { class: "gptbook-pe-table" },
      el("div", { class: "gptbook-title" }, `${T} × ${C} table`),
      el("div", { class: "gptbook-pe-stack" }, canvas, marks),
      el("div", { class: "gptbook-tick" }, "rows: position · columns: dimension"),
      el("div", { class: "gptbook-tick gptbook-pe-key" }, "−1 ", el("span", { class: "gptbook-pe-ramp" }), " 0 ", el("span", { class: "gptbook-pe-ramp gptbook-pe-ramp-up" }), " +1"),
    );
    root.replaceChildren(
      el("div", { class: "gptbook-controls" }, posSlider.row, dimSlider.row),
      el("div", { class: "gptbook-pe-layout" }, tableBox, el("div", { class: "gptbook-pe-right" }, rowBar, wave)),
    );
    draw();
  }

  function lineChart(svg, values, marked, title) {
    const width = 420;
    const height = 200;
    const left = 40;
    const top = 24;
    const bottom = 34;
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const x = (i) => left + (i / (values.length - 1)) * (width - left - 8);
    const y = (v) => top + ((1.1 - v) / 2.2) * (height - top - bottom);
    svg.append(svgEl("text", { x: width / 2, y: 15, "text-anchor": "middle", class: "gptbook-title" }, title));
    for (const tick of [-1, 0, 1]) {
      svg.append(svgEl("line", { x1: left, x2: width - 8, y1: y(tick), y2: y(tick), class: "gptbook-grid" }));
      svg.append(svgEl("text", { x: left - 4, y: y(tick) + 4, "text-anchor": "end", class: "gptbook-tick" }, String(tick)));
    }
    const points = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(svgEl("polyline", { points, fill: "none", stroke: BAR, "stroke-width": 1.5 }));
    svg.append(svgEl("circle", { cx: x(marked), cy: y(values[marked]), r: 4, fill: "currentColor" }));
    svg.append(svgEl("text", { x: width / 2, y: height - 4, "text-anchor": "middle", class: "gptbook-tick" }, "position"));
  }

  // ---- chapter 5: why the scores are divided by √d_k ------------------------------------------

  /** Standard normal numbers from a seed (mulberry32 + Box-Muller). */
  function normals(seed, n) {
    const random = book.seededRandom(seed);
    const out = [];
    while (out.length < n) {
      const u = 1 - random();
      const v = random();
      const r = Math.sqrt(-2 * Math.log(u));
      out.push(r * Math.cos(2 * Math.PI * v), r * Math.sin(2 * Math.PI * v));
    }
    return out.slice(0, n);
  }

  function scaling(root) {
    const nKeys = Number(root.dataset.keys || 16);
    const widths = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
    let index = Math.max(0, widths.indexOf(Number(root.dataset.dK || 64)));
    let seed = Number(root.dataset.seed || 0);
    const raw = svgEl("svg", { class: "gptbook-chart" });
    const scaled = svgEl("svg", { class: "gptbook-chart" });
    const caption = el("div", { class: "gptbook-caption" });
    const keyLabels = Array.from({ length: nKeys }, (_, i) => String(i));

    function draw() {
      const dk = widths[index];
      const numbers = normals(seed * 7919 + dk, dk * (nKeys + 1));
      const query = numbers.slice(0, dk);
      const scores = Array.from({ length: nKeys }, (_, j) => {
        let dot = 0;
        for (let c = 0; c < dk; c++) dot += query[c] * numbers[dk * (j + 1) + c];
        return dot;
      });
      const wRaw = softmax(scores);
      const wScaled = softmax(scores.map((s) => s / Math.sqrt(dk)));
      const top = (w) => Math.max(...w).toFixed(2);
      barChart(raw, { values: wRaw, labels: keyLabels, title: `softmax(q·k): largest weight ${top(wRaw)}`, xlabel: "key", width: 320 });
      barChart(scaled, { values: wScaled, labels: keyLabels, title: `softmax(q·k / √${dk}): largest weight ${top(wScaled)}`, xlabel: "key", width: 320 });
      caption.textContent =
        `One random query against ${nKeys} random keys, each of length d_k = ${dk} with unit-variance entries ` +
        `(drawn in your browser from seed ${seed}). Unscaled, the scores spread over about ±${(2 * Math.sqrt(dk)).toFixed(1)}; ` +
        `divided by √${dk} = ${Math.sqrt(dk).toFixed(2)} they spread over about ±2 whatever d_k is.`;
      root.dataset.state = `${dk},${seed}`;
    }

    const dkSlider = slider("d_k", { min: 0, max: widths.length - 1, value: index, format: (i) => String(widths[i]) }, (v) => {
      index = v;
      draw();
    });
    const seedSlider = slider("seed", { min: 0, max: 20, value: seed }, (v) => {
      seed = v;
      draw();
    });
    dkSlider.input.classList.add("gptbook-dk");
    seedSlider.input.classList.add("gptbook-seed");
    root.replaceChildren(
      el("div", { class: "gptbook-controls" }, dkSlider.row, seedSlider.row),
      el("div", { class: "gptbook-pair" }, raw, scaled),
      caption,
    );
    draw();
  }

  // ---- chapter 6: softmax with a temperature -------------------------------------------------

  function temperature(root) {
    const scores = JSON.parse(root.dataset.scores || "[2, 1, 0.1, -1, 0.5]");
    const labels = JSON.parse(root.dataset.labels || "null") || scores.map((_, i) => `key ${i}`);
    const chart = svgEl("svg", { class: "gptbook-chart gptbook-single" });
    const atOne = softmax(scores);
    let logTau = 0;

    function draw() {
      const tau = 10 ** logTau;
      const w = softmax(scores, tau);
      const entropy = -w.reduce((s, p) => s + (p > 0 ? p * Math.log(p) : 0), 0);
      barChart(chart, {
        values: w,
        labels,
        title: `τ = ${+tau.toPrecision(3)}: largest weight ${Math.max(...w).toFixed(2)}, entropy ${entropy.toFixed(2)} nats (uniform ${Math.log(w.length).toFixed(2)})`,
        outline: atOne,
        width: 520,
      });
      root.dataset.state = String(tau);
    }

    const tauSlider = slider("τ", { min: -1.3, max: 1.3, step: 0.05, value: 0, format: (v) => (10 ** v).toPrecision(3) }, (v) => {
      logTau = v;
      draw();
    });
    tauSlider.input.classList.add("gptbook-tau");
    root.replaceChildren(
      el("div", { class: "gptbook-controls" }, tauSlider.row),
      chart,
      el("div", { class: "gptbook-caption" }, "softmax(z / τ) for the scores above; hollow bars: τ = 1. Low temperature sharpens, high temperature flattens."),
    );
    draw();
  }

  const FIGURES = { "positional-encoding": positionalEncoding, scaling, temperature };

  function init() {
    for (const root of document.querySelectorAll(".gptbook-figure[data-figure]:not(.gptbook-ready)")) {
      const make = FIGURES[root.dataset.figure];
      if (!make) {
        root.textContent = `unknown interactive figure "${root.dataset.figure}"`;
        continue;
      }
      make(root);
      root.classList.add("gptbook-ready");
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})(window);
