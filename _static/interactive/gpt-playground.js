/* "Try the model": chapter 10's trained model, running in the page.
 *
 * The page holds an empty <div id="gpt-playground">. This script loads the exported model
 * (../web-model/model.js and tokenizer.js, next to this file's folder, written when the book is
 * built) with <script> tags, which also work when the book is opened from a folder on disk, and
 * then builds the panels: tokens, attention weights, next-token probabilities and generation.
 * Everything is computed in the browser by gpt-tokenizer.js and gpt-model.js.
 */
(function (global) {
  "use strict";

  const book = (global.GPTBook = global.GPTBook || {});
  const here = document.currentScript ? document.currentScript.src : "";
  const DEFAULT_PROMPT = "A good salesperson builds trust with the customer";

  function loadScript(url) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`could not load ${url}`));
      document.head.appendChild(script);
    });
  }

  /** A DOM element: el("div", {class: "x"}, child, "text", ...). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    for (const c of children) node.append(c);
    return node;
  }

  function svgEl(tag, attrs = {}) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  }

  /** White -> dark blue for attention weights in [0, 1]. */
  function weightColour(w) {
    const t = Math.max(0, Math.min(1, w));
    const mix = (a, b) => Math.round(a + (b - a) * t);
    return `rgb(${mix(255, 8)}, ${mix(255, 48)}, ${mix(255, 107)})`;
  }

  function shortLabel(s, n = 12) {
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  /** The attention weights of one head as a T x T heatmap with token labels. */
  function drawAttention(svg, weights, labels) {
    svg.replaceChildren();
    const T = labels.length;
    const cell = Math.max(18, Math.min(34, Math.floor(480 / T)));
    const margin = 110;
    const size = margin + T * cell + 10;
    svg.setAttribute("viewBox", `0 0 ${size} ${size}`);
    svg.setAttribute("width", size);
    svg.setAttribute("height", size);
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        const w = weights[i][j];
        const rect = svgEl("rect", {
          x: margin + j * cell,
          y: margin + i * cell,
          width: cell - 1,
          height: cell - 1,
          fill: j > i ? "#eeeeee" : weightColour(w),
        });
        const title = svgEl("title");
        title.textContent = j > i ? "masked (a future token)" : `${labels[i]} → ${labels[j]}: ${w.toFixed(3)}`;
        rect.append(title);
        svg.append(rect);
        if (j <= i && cell >= 26) {
          const text = svgEl("text", {
            x: margin + j * cell + cell / 2,
            y: margin + i * cell + cell / 2 + 4,
            "text-anchor": "middle",
            "font-size": 9,
            fill: w > 0.55 ? "white" : "#222",
          });
          text.textContent = w.toFixed(2).replace(/^0/, "");
          svg.append(text);
        }
      }
      const rowLabel = svgEl("text", { x: margin - 6, y: margin + i * cell + cell / 2 + 4, "text-anchor": "end", "font-size": 12 });
      rowLabel.textContent = shortLabel(labels[i]);
      svg.append(rowLabel);
      const x = margin + i * cell + cell / 2;
      const colLabel = svgEl("text", { x, y: margin - 6, "text-anchor": "start", "font-size": 12, transform: `rotate(-60 ${x} ${margin - 6})` });
      colLabel.textContent = shortLabel(labels[i]);
      svg.append(colLabel);
    }
    const axis = svgEl("text", { x: 4, y: 14, "font-size": 12, fill: "#555" });
    axis.textContent = "rows: query token · columns: key token";
    svg.append(axis);
  }

  class Playground {
    constructor(root, model, tokenizer) {
      this.root = root;
      this.model = model;
      this.tokenizer = tokenizer;
      this.result = null; // the last analysed prompt, for the panels (and the book's tests)
      this.timings = {};
      this.build();
    }

    build() {
      const { n_blocks: nBlocks, n_heads: nHeads, context_length: T, vocab_size: V } = this.model.config;
      const option = (i) => el("option", { value: i }, String(i));
      this.prompt = el("textarea", { id: "gptp-prompt", rows: 2, spellcheck: "false" });
      this.prompt.value = DEFAULT_PROMPT;
      this.tokens = el("div", { id: "gptp-tokens", class: "gptp-tokens" });
      this.unknown = el("div", { id: "gptp-unknown", class: "gptp-message", hidden: "" });
      this.blockSelect = el("select", { id: "gptp-block" }, ...Array.from({ length: nBlocks }, (_, i) => option(i)));
      this.headSelect = el("select", { id: "gptp-head" }, ...Array.from({ length: nHeads }, (_, i) => option(i)));
      this.attention = svgEl("svg", { id: "gptp-attention", class: "gptp-attention", role: "img" });
      this.temperature = el("input", { id: "gptp-temperature", type: "range", min: -1, max: 1, step: 0.05, value: 0 });
      this.temperatureValue = el("output", { id: "gptp-temperature-value" });
      this.next = el("table", { id: "gptp-next", class: "gptp-next" });
      this.steps = el("input", { id: "gptp-steps", type: "number", min: 1, max: 200, value: 30 });
      this.genTemperature = el("input", { id: "gptp-gen-temperature", type: "number", min: 0, max: 3, step: 0.1, value: 0.8 });
      this.topK = el("input", { id: "gptp-topk", type: "number", min: 0, max: V, value: 10 });
      this.seed = el("input", { id: "gptp-seed", type: "number", min: 0, value: 1 });
      this.generateButton = el("button", { id: "gptp-generate", type: "button" }, "Generate");
      this.output = el("div", { id: "gptp-output", class: "gptp-output" });
      this.timing = el("div", { id: "gptp-timing", class: "gptp-note" });

      const section = (title, ...children) => el("section", { class: "gptp-panel" }, el("h3", {}, title), ...children);
      this.root.replaceChildren(
        section(
          "1. Your prompt and its tokens",
          el("label", { for: "gptp-prompt" }, `Type some text (the model reads the last ${T} tokens):`),
          this.prompt,
          this.tokens,
          this.unknown,
        ),
        section(
          "2. Attention weights",
          el("div", { class: "gptp-controls" },
            el("label", {}, "block ", this.blockSelect),
            el("label", {}, "head ", this.headSelect)),
          el("div", { class: "gptp-scroll" }, this.attention),
        ),
        section(
          "3. The next token",
          el("div", { class: "gptp-controls" },
            el("label", { for: "gptp-temperature" }, "temperature "), this.temperature, this.temperatureValue),
          this.next,
        ),
        section(
          "4. Generate a continuation",
          el("div", { class: "gptp-controls" },
            el("label", {}, "new tokens ", this.steps),
            el("label", {}, "temperature ", this.genTemperature),
            el("label", {}, "top-k ", this.topK),
            el("label", {}, "seed ", this.seed),
            this.generateButton),
          this.output,
          this.timing,
        ),
      );
      this.prompt.addEventListener("input", () => this.update());
      this.blockSelect.addEventListener("change", () => this.showAttention());
      this.headSelect.addEventListener("change", () => this.showAttention());
      this.temperature.addEventListener("input", () => this.showNext());
      this.generateButton.addEventListener("click", () => this.generate());
    }

    get temperatureNow() {
      return 10 ** Number(this.temperature.value);
    }

    /** Tokenize the prompt, run the model on its last context_length tokens, refresh the panels. */
    analyse(text) {
      const started = performance.now();
      const cl100k = this.tokenizer.encode(text);
      const tokens = cl100k.map((id) => ({
        cl100k: id,
        model: this.model.toModelId(id),
        text: this.tokenizer.tokenString(id),
      }));
      const unknown = tokens.filter((t) => t.model === undefined);
      const result = { text, tokens, unknown, window: [], logits: null, attention: null };
      if (tokens.length && !unknown.length) {
        const T = this.model.config.context_length;
        result.window = tokens.slice(-T);
        const out = this.model.forward(result.window.map((t) => t.model));
        result.logits = out.logits.map((row) => Array.from(row));
        result.attention = out.attention;
      }
      result.ms = performance.now() - started;
      return result;
    }

    update() {
      this.result = this.analyse(this.prompt.value);
      this.showTokens();
      this.showAttention();
      this.showNext();
      this.root.dataset.updates = String(Number(this.root.dataset.updates || 0) + 1);
    }

    showTokens() {
      const { tokens, unknown, window } = this.result;
      const firstSeen = window.length ? tokens.length - window.length : 0; // earlier: not read
      this.tokens.replaceChildren(
        ...tokens.map((t, i) =>
          el(
            "span",
            {
              class: "gptp-token" + (t.model === undefined ? " gptp-unknown" : "") + (i < firstSeen ? " gptp-outside" : ""),
              "data-cl100k": t.cl100k,
              "data-model": t.model === undefined ? "" : t.model,
              title: t.model === undefined ? "not in the model's vocabulary" : `cl100k id ${t.cl100k}, model id ${t.model}`,
            },
            el("span", { class: "gptp-token-text" }, t.text),
            el("span", { class: "gptp-token-id" }, t.model === undefined ? `${t.cl100k} · ?` : `${t.cl100k} · ${t.model}`),
          ),
        ),
      );
      if (!tokens.length) {
        this.showMessage("Type at least one word to see what the model makes of it.");
      } else if (unknown.length) {
        const names = [...new Set(unknown.map((t) => `“${t.text}” (cl100k id ${t.cl100k})`))];
        this.showMessage(
          `The model has never seen ${names.length === 1 ? "this token" : "these tokens"}: ${names.join(", ")}. ` +
            `Its vocabulary is only the tokens of ${global.gptWebModel.corpus || "the text"} it was trained on, so it has no ` +
            "vector for them (chapter 10). Rephrase the prompt without them.",
        );
      } else {
        this.unknown.hidden = true;
      }
    }

    showMessage(text) {
      this.unknown.textContent = text;
      this.unknown.hidden = false;
    }

    showAttention() {
      const r = this.result;
      if (!r || !r.attention) {
        this.attention.replaceChildren();
        this.attention.setAttribute("width", 0);
        this.attention.setAttribute("height", 0);
        return;
      }
      const weights = r.attention[Number(this.blockSelect.value)][Number(this.headSelect.value)];
      drawAttention(this.attention, weights, r.window.map((t) => t.text));
    }

    showNext() {
      const tau = this.temperatureNow;
      this.temperatureValue.textContent = tau.toFixed(2);
      const r = this.result;
      if (!r || !r.logits) {
        this.next.replaceChildren();
        return;
      }
      const last = r.logits[r.logits.length - 1];
      const probs = book.softmax(last, tau);
      const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a]).slice(0, 10);
      this.next.replaceChildren(
        el("tr", {}, el("th", {}, "next token"), el("th", {}, "probability"), el("th", {}, "")),
        ...order.map((id) => {
          const bar = el("span", { class: "gptp-bar" });
          bar.style.width = `${(probs[id] * 100).toFixed(1)}%`;
          return el(
            "tr",
            { "data-model": id },
            el("td", { class: "gptp-token-text" }, this.tokenizer.tokenString(this.model.toCl100kId(id))),
            el("td", {}, probs[id].toFixed(3)),
            el("td", { class: "gptp-bar-cell" }, bar),
          );
        }),
      );
      if (this.timings.firstPrediction === undefined) {
        this.timings.firstPrediction = performance.now(); // since the page started loading
      }
    }

    generate() {
      const r = this.result;
      if (!r || !r.logits) {
        this.output.textContent = "Give a prompt the model can read first (see above).";
        return;
      }
      const steps = Math.max(1, Math.min(200, Number(this.steps.value) || 1));
      const temperature = Math.max(0, Number(this.genTemperature.value) || 0);
      const topK = Math.max(0, Math.floor(Number(this.topK.value) || 0));
      const random = book.seededRandom(Number(this.seed.value) || 0);
      const started = performance.now();
      const ids = this.model.generate(r.tokens.map((t) => t.model), steps, { temperature, topK, random });
      const seconds = (performance.now() - started) / 1000;
      const text = this.tokenizer.decode(ids.map((id) => this.model.toCl100kId(id)));
      this.output.replaceChildren(el("span", { class: "gptp-prompt-echo" }, r.text), el("strong", {}, text));
      this.timings.tokensPerSecond = steps / seconds;
      this.timing.textContent = `${steps} tokens in ${seconds.toFixed(2)} s (${(steps / seconds).toFixed(0)} tokens/s), computed in your browser.`;
      this.root.dataset.generated = String(Number(this.root.dataset.generated || 0) + 1);
    }
  }

  async function start(root) {
    const base = new URL("../web-model/", here);
    root.dataset.state = "loading";
    root.textContent = "Loading the trained model…";
    try {
      await loadScript(new URL("model.js", base).href);
      const data = global.gptWebModel;
      if (!data || !data.available) {
        root.replaceChildren(el("div", { class: "gptp-message", id: "gptp-missing" }, data ? data.message : "The model is missing from this build of the book."));
        root.dataset.state = "missing";
        return;
      }
      await loadScript(new URL("tokenizer.js", base).href);
      const model = new book.GPTModel(data);
      const tokenizer = new book.BytePairTokenizer(global.gptWebTokenizer);
      const playground = new Playground(root, model, tokenizer);
      book.playground = playground;
      playground.update();
      root.dataset.state = "ready";
    } catch (err) {
      root.replaceChildren(el("div", { class: "gptp-message" }, `The model could not be started: ${err.message}`));
      root.dataset.state = "error";
      throw err;
    }
  }

  function init() {
    const root = document.getElementById("gpt-playground");
    if (root && !root.dataset.state) start(root);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})(window);
